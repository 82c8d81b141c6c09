# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Rank worker: the global grad norm and the update of an MoE network on each engine path, at several
splits of one global batch of 8 samples (micro-batch x GAS x ranks), against fp64 PyTorch.

Case names are ``<path>_m<micro>_g<gas>``. One expert per expert-parallel rank (expert parallel 2):
on 2 ranks every rank holds a different expert; on 4 ranks each expert has 2 data-parallel replicas,
which must count once. SGD, so the update shows the clip coefficient (Adam's first step does not).
"""

import deepspeed  # noqa: E402
import deepspeed.comm as dist  # noqa: E402
from toolkit.collectives import train_step_counting_collectives  # noqa: E402
from helpers.engine_paths import BF16, FP16, relative_update_error  # noqa: E402
from helpers.moe_model import MoENet, fp64_gradients, fp64_norm  # noqa: E402
from helpers.rank_cases import force_fp16_on_cpu, run_cases  # noqa: E402
from helpers.small_model import SAMPLE_ITEMS, global_batch, micro_batch_losses, micro_batches, rank_share  # noqa: E402

GLOBAL_BATCH = 8
LR, CLIP = 0.1, 1.0

# path -> (config, optimizer, ZeRO stage)
PATHS = {
    "zero0_fp32": ({}, "SGD", 0),
    "zero0_fp32_no_clipping": ({
        "gradient_clipping": 0.0
    }, "SGD", 0),
    "zero0_fp16": (FP16, "SGD", 0),  # FP16_UnfusedOptimizer
    "zero0_fp16_fused_adam": (FP16, "Adam", 0),  # FP16_Optimizer
    "zero1_bf16_fp32_accumulation": (dict(BF16, data_types={"grad_accum_dtype": "fp32"}), "SGD", 1),
    "zero1_fp32": ({}, "SGD", 1),
    "zero2_fp32": ({}, "SGD", 2),
    "zero2_fp16": (FP16, "SGD", 2),
    "zero2_bf16": (BF16, "SGD", 2),
    # The D + E layout of the expert groups: on 4 ranks expert e on ranks 2e and 2e + 1 (E + D: e and e + 2).
    "zero2_fp32_data_before_expert": ({
        "use_data_before_expert_parallelism": True
    }, "SGD", 2),
}

# "loss_normalization": "per_item" on these paths: each sample holds this many items (its squared error
# counted once per item), so micro-batch means and the global item mean differ.
PER_ITEM = "_per_item"
PER_ITEM_PATHS = ["zero0_fp32", "zero0_fp16", "zero1_bf16_fp32_accumulation", "zero1_fp32", "zero2_fp32", "zero2_bf16"]
ITEMS = SAMPLE_ITEMS[:GLOBAL_BATCH]


def config(path, micro, gas):
    per_item = path.endswith(PER_ITEM)
    extra, optimizer, stage = PATHS[path.removesuffix(PER_ITEM)]
    params = {"lr": LR} if optimizer == "SGD" else {"lr": 1e-3, "torch_adam": False}
    cfg = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": gas,
        "optimizer": {
            "type": optimizer,
            "params": params
        },
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "gradient_clipping": CLIP,
        "zero_optimization": {
            "stage": stage
        },
    }
    cfg.update(extra)
    if per_item:
        cfg["loss_normalization"] = "per_item"
    return cfg


def own_parameters(model):
    """What this rank holds: the dense parameters and its expert's, in fp64 reference order."""
    return model.dense() + [model.expert().weight, model.expert().bias]


def case(path, micro, gas):

    def run():
        from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
        model = MoENet(ep_size=2, data_before_expert="data_before_expert" in path)
        groups = split_params_into_different_moe_groups_for_optimizer({
            "params": list(model.parameters()),
            "name": "dense"
        })
        cfg = config(path, micro, gas)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=groups, config=cfg)
        dtype = next(engine.module.parameters()).dtype
        inputs, targets = global_batch(GLOBAL_BATCH)
        inputs = inputs.to(dtype).float()  # the engine sees these values: the reference too
        per_item = path.endswith(PER_ITEM)
        dense_grads, expert_grads = fp64_gradients(engine.module, inputs, targets, ITEMS if per_item else None)
        reference_norm = fp64_norm(dense_grads, expert_grads)
        before = [p.detach().double().clone() for p in own_parameters(engine.module)]

        per_rank = GLOBAL_BATCH // dist.get_world_size()
        assert per_rank == micro * gas, f"split {micro} x {gas} x {dist.get_world_size()} != {GLOBAL_BATCH}"
        x, y = rank_share(inputs, targets, dist.get_rank(), per_rank)
        items = ITEMS[dist.get_rank() * per_rank:(dist.get_rank() + 1) * per_rank].split(micro)
        losses = micro_batch_losses(engine, micro_batches(x, y, micro, gas, dtype=dtype), items, per_item)
        step = train_step_counting_collectives(engine, losses)
        after = [p.detach().double() for p in own_parameters(engine.module)]
        engine.destroy()

        coef = min(1.0, CLIP / (reference_norm + 1e-6)) if cfg["gradient_clipping"] > 0 else 1.0
        reference_grads = dense_grads + expert_grads[model.expert_index]
        # What the weights should hold: the fp64 update, rounded to the module's dtype (fp16/bf16
        # weights round every update; compared unrounded, that rounding alone looks like an error).
        expected = [(w - LR * coef * g).to(dtype).double() for w, g in zip(before, reference_grads)]
        update_error = None
        if cfg["optimizer"]["type"] == "SGD":
            update_error = relative_update_error(after, expected, before)
        return {
            "optimizer": type(engine.optimizer).__name__,
            **step,
            "reference_norm": reference_norm,
            "clip_coefficient": coef,
            "update_error": update_error,
        }

    return run


def splits(world_size):
    per_rank = GLOBAL_BATCH // world_size
    return [(micro, per_rank // micro) for micro in (per_rank, per_rank // 2, 1) if micro >= 1][:3]


if __name__ == "__main__":
    force_fp16_on_cpu()
    import os
    world = int(os.environ.get("WORLD_SIZE", "2"))
    paths = list(PATHS) + [path + PER_ITEM for path in PER_ITEM_PATHS]
    run_cases({f"{path}_m{m}_g{g}": case(path, m, g) for path in paths for m, g in dict.fromkeys(splits(world))})
