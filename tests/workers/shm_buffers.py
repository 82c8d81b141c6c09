# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Rank worker: DeepSpeed's CPU shm all-reduce leaves no /dev/shm name behind, and still reduces right."""

import glob
import os

import torch  # noqa: E402

from toolkit.launch import SHM_BUFFER_GLOB  # noqa: E402
from helpers.rank_cases import run_cases  # noqa: E402


def shm_names_after_init():
    """Names of this job's all-reduce buffers still in /dev/shm once deepspeed.comm is initialized."""
    import deepspeed.comm as dist
    dist.barrier()  # every rank past its own initialization, before looking
    return sorted(os.path.basename(p) for p in glob.glob(SHM_BUFFER_GLOB.format(port=os.environ["MASTER_PORT"])))


def shm_all_reduce_sums():
    """inference_all_reduce (the shm path) on small and large (> its 32 MB chunk) tensors, fp32 and bf16."""
    import deepspeed.comm as dist
    world, rank = dist.get_world_size(), dist.get_rank()
    errors = {}
    for dtype in (torch.float32, torch.bfloat16):
        for numel in (1000, 9 * 1024 * 1024 + 7):
            tensor = torch.full((numel, ), float(rank + 1), dtype=dtype)
            dist.inference_all_reduce(tensor)
            expected = world * (world + 1) / 2
            errors[f"{dtype}-{numel}"] = (tensor.float() - expected).abs().max().item()
    return errors


if __name__ == "__main__":
    run_cases({"shm_names_after_init": shm_names_after_init, "shm_all_reduce_sums": shm_all_reduce_sums})
