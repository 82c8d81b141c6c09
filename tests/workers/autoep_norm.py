# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Rank worker: the global grad norm and the update of a network whose Mixtral-style MoE block AutoEP
converts (``"expert_parallel"``, preset ``mixtral``, expert parallel 2), at several splits of one global
batch of 8 samples (micro-batch x GAS x data-parallel ranks), against fp64 PyTorch on the unconverted
network and the whole batch.

Layouts, one per launch (AutoEP and AutoTP build their process groups once per process):

- ``ep2``: AutoEP alone. Every rank is a data-parallel rank with its own samples; on 2 ranks each holds 2
  of the 4 experts, on 4 ranks each expert also has a data-parallel replica.
- ``ep2_tp2``: AutoEP folded with AutoTP (``tensor_parallel.autotp_size`` 2, every weight whole, the layout
  of AutoEP's own parity tests): the 2 TP ranks of a data-parallel rank see the same samples and are its
  expert-parallel ranks; the engine corrects the folded gradients (experts divided by the TP size, the
  router averaged over the TP ranks).
- ``ep2_tp2_split``: the same with a dense MLP pair before the MoE block that AutoTP splits (column-parallel
  ``pre_up``, row-parallel ``pre_down``): the folding leaves their gradients to tensor parallelism, and the
  norm counts their slices on every TP rank and the rest once.

Case names are ``<path>_m<micro>_g<gas>``; the layout is the worker's argument (``--layout``).
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import deepspeed  # noqa: E402
import deepspeed.comm as dist  # noqa: E402
from helpers.autoep_model import IN, OUT, MixtralNet, fp64_gradients, original_layout  # noqa: E402
from helpers.collectives import train_step_counting_collectives  # noqa: E402
from helpers.engine_paths import BF16, ZERO_PATHS, relative_update_error  # noqa: E402
from helpers.rank_cases import force_fp16_on_cpu, run_cases  # noqa: E402
from helpers.small_model import micro_batches, mse, rank_share, sgd_config  # noqa: E402

GLOBAL_BATCH, TOKENS = 8, 4
# The fp64 norm is 0.80: clipping at 0.25 scales every update, so a wrong norm is a wrong update.
LR, CLIP = 0.1, 0.25
EP = 2
LAYOUTS = {"ep2": 1, "ep2_tp2": 2, "ep2_tp2_split": 2}  # layout -> autotp_size
SPLIT_SPECS = [{
    "patterns": [".*pre_up\\.weight$"],
    "partition_type": "column"
}, {
    "patterns": [".*pre_down\\.weight$"],
    "partition_type": "row"
}]
PATHS = dict(ZERO_PATHS, zero3_fp32=({}, 3), zero3_bf16=(BF16, 3))  # path -> (config, ZeRO stage)


def config(layout, path, micro, gas):
    extra, stage = PATHS[path]
    cfg = sgd_config(micro, gas, CLIP, LR)
    cfg.update(extra)
    cfg["zero_optimization"] = {"stage": stage}
    cfg["expert_parallel"] = {"enabled": True, "autoep_size": EP, "preset_model": "mixtral", "use_grouped_mm": False}
    if LAYOUTS[layout] > 1:
        skip_the_rest = [{"patterns": [".*\\.weight$"], "partition_type": "skip"}]
        specs = (SPLIT_SPECS if layout.endswith("_split") else []) + skip_the_rest
        cfg["tensor_parallel"] = {
            "autotp_size": LAYOUTS[layout],
            "partition_config": {
                "use_default_specs": False,
                "layer_specs": specs
            },
        }
    return cfg


def whole_layout(engine):
    """``original_layout`` of the engine's module; under ZeRO-3 with its partitioned parameters gathered."""
    if engine.zero_optimization_stage() < 3:
        return original_layout(engine.module)
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        return original_layout(engine.module)


def global_batch():
    gen = torch.Generator().manual_seed(4321)
    return torch.randn(GLOBAL_BATCH, TOKENS, IN, generator=gen), torch.randn(GLOBAL_BATCH, TOKENS, OUT, generator=gen)


def case(layout, path, micro, gas):

    def run():
        cfg = config(layout, path, micro, gas)
        engine, *_ = deepspeed.initialize(model=MixtralNet(dense_pair=layout.endswith("_split")), config=cfg)
        dtype = next(engine.module.parameters()).dtype
        inputs, targets = global_batch()
        inputs = inputs.to(dtype).float()  # the engine sees these values: the reference too
        before = whole_layout(engine)  # the weights as the engine holds them (rounded to its dtype)
        reference = fp64_gradients(before, inputs, targets)
        reference_norm = float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in reference.values()])))

        tp = LAYOUTS[layout]
        dp_world, dp_rank = dist.get_world_size() // tp, dist.get_rank() // tp
        per_rank = GLOBAL_BATCH // dp_world
        assert per_rank == micro * gas, f"split {micro} x {gas} x {dp_world} != {GLOBAL_BATCH}"
        x, y = rank_share(inputs, targets, dp_rank, per_rank)  # TP ranks: the same samples
        losses = ((mse(engine(batch), target), {}) for batch, target in micro_batches(x, y, micro, gas, dtype=dtype))
        step = train_step_counting_collectives(engine, losses)
        after = whole_layout(engine)
        engine.destroy()

        coef = min(1.0, CLIP / (reference_norm + 1e-6))
        # What the weights should hold: the fp64 update, rounded to the module's dtype.
        expected = {name: (w - LR * coef * reference[name]).to(dtype).double() for name, w in before.items()}
        return {
            "optimizer": type(engine.optimizer).__name__,
            **step,
            "reference_norm": reference_norm,
            "clip_coefficient": coef,
            "update_error": relative_update_error(*([d[n] for n in before] for d in (after, expected, before))),
        }

    return run


def splits(world_size, layout):
    per_rank = GLOBAL_BATCH // (world_size // LAYOUTS[layout])
    return [(micro, per_rank // micro) for micro in (per_rank, per_rank // 2, per_rank // 4) if micro >= 1]


if __name__ == "__main__":
    force_fp16_on_cpu()
    import os
    parser = argparse.ArgumentParser()
    parser.add_argument("--layout", choices=sorted(LAYOUTS), required=True)
    layout = parser.parse_known_args()[0].layout
    world = int(os.environ.get("WORLD_SIZE", "2"))
    run_cases({f"{path}_m{m}_g{g}": case(layout, path, m, g) for path in PATHS for m, g in splits(world, layout)})
