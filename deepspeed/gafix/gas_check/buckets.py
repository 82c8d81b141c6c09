# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Bucket and partition sizes that make a small model take a large model's paths.

DeepSpeed's defaults (reduce and all-gather buckets of 5e8 elements, ZeRO-3 prefetch and persistence
thresholds, optimizer sub-groups of 1e9) put a small model in one bucket, kept whole: the code that
reduces a full bucket in the middle of a backward, splits a parameter over prefetch buckets or steps
several optimizer sub-groups never runs, while on a 7B model it runs every step. With these sizes a
small model spans several buckets and sub-groups on every path.
"""

BUCKETS_PER_MODEL = 8
ALIGNMENT = 8


def small_bucket_sizes(model):
    """Sizes (in elements) for ``model``: about BUCKETS_PER_MODEL buckets, each below the largest tensor, odd so
    that they do not line up with power-of-two tensor sizes; no parameter persists whole on every rank."""
    sizes = [p.numel() for p in model.parameters() if p.requires_grad]
    if not sizes:
        raise ValueError("--small-buckets: the model has no trainable parameter")
    bucket = max(2, min(max(sizes) // 2 + 1, sum(sizes) // BUCKETS_PER_MODEL)) | 1
    return {
        "reduce_bucket_size": bucket,
        # ZeRO-1/2 require a multiple of their alignment (2 or 4 elements by dtype).
        "allgather_bucket_size": -(-bucket // ALIGNMENT) * ALIGNMENT,
        "stage3_prefetch_bucket_size": bucket,
        "stage3_param_persistence_threshold": 0,
        "stage3_max_live_parameters": bucket,
        "stage3_max_reuse_distance": bucket,
        "sub_group_size": bucket,
    }


def with_small_buckets(config, model):
    """``config`` with the sizes of small_bucket_sizes(model) in its zero_optimization section (they replace the
    config's own), and a line saying what was set."""
    sizes = small_bucket_sizes(model)
    zero = dict(config.get("zero_optimization", {}), **sizes)
    note = (f"small buckets: {sizes['reduce_bucket_size']} elements per reduce and prefetch bucket and optimizer "
            f"sub-group ({sizes['allgather_bucket_size']} per all-gather), no persistent parameter "
            f"({sum(p.numel() for p in model.parameters())} parameters in all)")
    return dict(config, zero_optimization=zero), note
