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
- ``hf_ep2``, ``hf_ep2_tp2``: a Hugging Face ``MixtralForCausalLM`` (``helpers.autoep_hf_model``: 2 decoder
  layers, attention, RMSNorms, embeddings; its causal-LM loss) instead of the small network, as ``ep2`` and
  ``ep2_tp2``.
- ``hf_ep2_compiled``: as ``hf_ep2``, the engine compiled around the experts (``"compile": {"autoep_non_moe":
  true}``, then ``engine.compile()``: torch.compile of the decoder layers that hold AutoEP's layers, those eager), as
  a training script that compiles does (not on ZeRO-3: refused there).

Case names are ``<path>_m<micro>_g<gas>``; the layout is the worker's argument (``--layout``).
"""

import argparse

import torch  # noqa: E402

import deepspeed  # noqa: E402
import deepspeed.comm as dist  # noqa: E402
from helpers import autoep_hf_model, autoep_model  # noqa: E402
from helpers.autoep_model import IN, OUT, MixtralNet, original_layout  # noqa: E402
from toolkit.collectives import train_step_counting_collectives  # noqa: E402
from helpers.engine_paths import BF16, ZERO_PATHS, relative_update_error  # noqa: E402
from helpers.rank_cases import force_fp16_on_cpu, run_cases  # noqa: E402
from helpers.small_model import micro_batches, mse, rank_share, sgd_config  # noqa: E402

GLOBAL_BATCH, TOKENS = 8, 4
EP = 2


class SmallNet:
    """``autoep_model.MixtralNet``: float inputs, the mean-square loss."""
    blocks = 1
    # The fp64 norm is 0.80: clipping at 0.25 scales every update, so a wrong norm is a wrong update.
    lr, clip = 0.1, 0.25

    def __init__(self, dense_pair=False):
        self.dense_pair = dense_pair

    def build(self):
        return MixtralNet(dense_pair=self.dense_pair)

    def batch(self):
        gen = torch.Generator().manual_seed(4321)
        inputs = torch.randn(GLOBAL_BATCH, TOKENS, IN, generator=gen)
        return inputs, torch.randn(GLOBAL_BATCH, TOKENS, OUT, generator=gen)

    def as_the_engine_sees(self, inputs, dtype):
        return inputs.to(dtype).float()

    def losses(self, engine, x, y, micro, gas, dtype):
        return ((mse(engine(batch), target), {}) for batch, target in micro_batches(x, y, micro, gas, dtype=dtype))

    def fp64_gradients(self, weights, inputs, targets):
        return autoep_model.fp64_gradients(weights, inputs, targets)


class HFMixtral:
    """``autoep_hf_model``'s ``MixtralForCausalLM``: token ids in, its causal-LM loss."""
    blocks = autoep_hf_model.LAYERS
    # The fp64 norm is 2.57: clipping at 1.0 scales the update. Its weights (std 0.2) are larger than the small
    # network's: a larger step keeps the bf16 update above the weights' rounding.
    lr, clip = 1.0, 1.0

    def build(self):
        autoep_hf_model.let_autoep_read_the_output_capture_registry()
        return autoep_hf_model.mixtral_causal_lm()

    def batch(self):
        return autoep_hf_model.global_batch(GLOBAL_BATCH)

    def as_the_engine_sees(self, inputs, dtype):
        return inputs  # token ids

    def losses(self, engine, x, y, micro, gas, dtype):
        return ((autoep_hf_model.causal_lm_loss(engine, batch, labels), {})
                for batch, labels in micro_batches(x, y, micro, gas))

    def fp64_gradients(self, weights, inputs, targets):
        return autoep_hf_model.fp64_gradients(weights, inputs, targets)


# layout -> (the model, autotp_size)
LAYOUTS = {
    "ep2": (SmallNet(), 1),
    "ep2_tp2": (SmallNet(), 2),
    "ep2_tp2_split": (SmallNet(dense_pair=True), 2),
    "hf_ep2": (HFMixtral(), 1),
    "hf_ep2_tp2": (HFMixtral(), 2),
    "hf_ep2_compiled": (HFMixtral(), 1),
}
# Layouts whose engine is compiled around the experts (compile.autoep_non_moe, then engine.compile()).
# The small network holds its MoE block in a container with no forward of its own, which the option refuses.
COMPILED = {"hf_ep2_compiled"}
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
    model = LAYOUTS[layout][0]
    cfg = sgd_config(micro, gas, model.clip, model.lr)
    cfg.update(extra)
    cfg["zero_optimization"] = {"stage": stage}
    cfg["expert_parallel"] = {"enabled": True, "autoep_size": EP, "preset_model": "mixtral", "use_grouped_mm": False}
    if layout in COMPILED:
        cfg["compile"] = {"autoep_non_moe": True}
    if LAYOUTS[layout][1] > 1:
        skip_the_rest = [{"patterns": [".*\\.weight$"], "partition_type": "skip"}]
        specs = (SPLIT_SPECS if getattr(model, "dense_pair", False) else []) + skip_the_rest
        cfg["tensor_parallel"] = {
            "autotp_size": LAYOUTS[layout][1],
            "partition_config": {
                "use_default_specs": False,
                "layer_specs": specs
            },
        }
    return cfg


def whole_layout(engine, blocks):
    """``original_layout`` of the engine's module; under ZeRO-3 with its partitioned parameters gathered."""
    if engine.zero_optimization_stage() < 3:
        return original_layout(engine.module, blocks)
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        return original_layout(engine.module, blocks)


def compile_around_experts(engine):
    """``engine.compile()`` under compile.autoep_non_moe: torch.compile of the modules holding AutoEP's layers, the
    layers themselves eager; fails unless it compiled some."""
    engine.compile()
    if not engine._compiled_regions:
        raise RuntimeError("compile.autoep_non_moe: engine.compile() compiled no region")


def case(layout, path, micro, gas):

    def run():
        model, tp = LAYOUTS[layout]
        engine, *_ = deepspeed.initialize(model=model.build(), config=config(layout, path, micro, gas))
        if layout in COMPILED:
            compile_around_experts(engine)
        dtype = next(engine.module.parameters()).dtype
        inputs, targets = model.batch()
        inputs = model.as_the_engine_sees(inputs, dtype)  # the reference too
        before = whole_layout(engine, model.blocks)  # the weights as the engine holds them (rounded to its dtype)
        reference = model.fp64_gradients(before, inputs, targets)
        reference_norm = float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in reference.values()])))

        dp_world, dp_rank = dist.get_world_size() // tp, dist.get_rank() // tp
        per_rank = GLOBAL_BATCH // dp_world
        assert per_rank == micro * gas, f"split {micro} x {gas} x {dp_world} != {GLOBAL_BATCH}"
        x, y = rank_share(inputs, targets, dp_rank, per_rank)  # TP ranks: the same samples
        step = train_step_counting_collectives(engine, model.losses(engine, x, y, micro, gas, dtype))
        after = whole_layout(engine, model.blocks)
        engine.destroy()

        coef = min(1.0, model.clip / (reference_norm + 1e-6))
        # What the weights should hold: the fp64 update, rounded to the module's dtype.
        expected = {name: (w - model.lr * coef * reference[name]).to(dtype).double() for name, w in before.items()}
        return {
            "optimizer": type(engine.optimizer).__name__,
            **step,
            "reference_norm": reference_norm,
            "clip_coefficient": coef,
            "update_error": relative_update_error(*([d[n] for n in before] for d in (after, expected, before))),
        }

    return run


def splits(world_size, layout):
    per_rank = GLOBAL_BATCH // (world_size // LAYOUTS[layout][1])
    return [(micro, per_rank // micro) for micro in (per_rank, per_rank // 2, per_rank // 4) if micro >= 1]


if __name__ == "__main__":
    force_fp16_on_cpu()
    import os
    parser = argparse.ArgumentParser()
    parser.add_argument("--layout", choices=sorted(LAYOUTS), required=True)
    layout = parser.parse_known_args()[0].layout
    world = int(os.environ.get("WORLD_SIZE", "2"))
    run_cases({f"{path}_m{m}_g{g}": case(layout, path, m, g) for path in PATHS for m, g in splits(world, layout)})
