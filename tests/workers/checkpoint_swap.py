# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Rank side of tests/test_checkpoint_swap.py and tests/test_resume_world_size.py: train, checkpoint, continue; or
load and continue.

Every configuration is run as up to four kinds of case. ``save/<config>`` (``--save DIR``) trains
SAVE_AT steps, saves a checkpoint under ``DIR/<config>``, trains CONTINUE more steps in the same
process and reports the weights. ``resume-<label>/<config>`` (``--resume LABEL=DIR``) builds the
engine from other initial weights, loads ``DIR/<config>`` (written by whichever install), reports
the restored state, trains the same CONTINUE steps and reports the weights. ``universal-<label>/...``
(``--universal LABEL=DIR``) does the same from the tag ``universal`` (a ds_to_universal conversion), and
``reshard-<label>/...`` (``--reshard LABEL=DIR``) with ``"checkpoint": {"reshard_on_load": true}``, for a
checkpoint written on another number of ranks.

Each step trains one global batch of GLOBAL samples whatever the world size: GAS is GLOBAL / (MICRO x
data-parallel ranks), and micro-batch k of the step is the same data on any number of ranks.
"""

import argparse
from pathlib import Path

import torch  # noqa: E402

import deepspeed  # noqa: E402
import deepspeed.comm as dist  # noqa: E402
from helpers.rank_cases import run_cases  # noqa: E402
from helpers.small_model import IN, OUT, make_layers, mse  # noqa: E402

SAVE_AT, CONTINUE, MICRO = 3, 3, 2
GLOBAL = 8  # samples per step: 2 ranks x GAS 2, 1 rank x GAS 4, 4 ranks x GAS 1
TAG = "swap"
# torch's Adam: no JIT build of FusedAdam / DeepSpeedCPUAdam on either install.
ADAM = {"type": "Adam", "params": {"lr": 1e-2, "weight_decay": 0.01, "torch_adam": True}}
# DeepSpeed's Muon: momentum and Newton-Schulz on the matrices (momentum_buffer), Adam on the biases (exp_avg,
# exp_avg_sq): one checkpoint holds both kinds of state, one param group each.
MUON = {"type": "Muon", "params": {"lr": 1e-2, "momentum": 0.9, "weight_decay": 0.01}}
WARMUP = {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 1e-2, "warmup_num_steps": 10}}
# Dynamic loss scale with a short window: the scale grows inside the run, so its state (scale,
# counters since the last overflow) must cross the checkpoint. Initial scale 2^20 overflows once.
FP16 = {"enabled": True, "loss_scale": 0, "initial_scale_power": 20, "loss_scale_window": 2, "hysteresis": 1}
# An fp16 run whose optimizer steps from the first step (2^8 does not overflow this model): Adam's states, the master
# weights and a loss scale that has grown (window 2) cross the checkpoint.
FP16_STEPPING = {"enabled": True, "loss_scale": 0, "initial_scale_power": 8, "loss_scale_window": 2, "hysteresis": 1}
CONFIGS = {
    "zero1_fp32": {
        "zero_optimization": {
            "stage": 1
        },
        "gradient_clipping": 0.0
    },
    "zero3_fp32": {
        "zero_optimization": {
            "stage": 3
        },
        "gradient_clipping": 0.0
    },
    "zero1_fp32_clip": {
        "zero_optimization": {
            "stage": 1
        },
        "gradient_clipping": 0.5
    },
    "zero2_fp32_clip": {
        "zero_optimization": {
            "stage": 2
        },
        "gradient_clipping": 0.5
    },
    "zero3_fp32_clip": {
        "zero_optimization": {
            "stage": 3
        },
        "gradient_clipping": 0.5
    },
    "zero1_bf16_clip": {
        "zero_optimization": {
            "stage": 1
        },
        "bf16": {
            "enabled": True
        },
        "gradient_clipping": 0.5
    },
    # BF16_Optimizer: bf16 weights, fp32 gradient accumulation.
    "zero1_bf16_fp32_accum_clip": {
        "zero_optimization": {
            "stage": 1
        },
        "bf16": {
            "enabled": True
        },
        "data_types": {
            "grad_accum_dtype": "fp32"
        },
        "gradient_clipping": 0.5
    },
    "zero2_round_robin_fp32_clip": {
        "zero_optimization": {
            "stage": 2,
            "round_robin_gradients": True
        },
        "gradient_clipping": 0.5
    },
    "zero2_fp16_dynamic_scale_clip": {
        "zero_optimization": {
            "stage": 2
        },
        "fp16": FP16,
        "gradient_clipping": 0.5
    },
    "zero3_fp16_dynamic_scale": {
        "zero_optimization": {
            "stage": 3
        },
        "fp16": FP16
    },
    "zero1_fp16_stepping_clip": {
        "zero_optimization": {
            "stage": 1
        },
        "fp16": FP16_STEPPING,
        "gradient_clipping": 0.5
    },
    "zero2_fp16_stepping_clip": {
        "zero_optimization": {
            "stage": 2
        },
        "fp16": FP16_STEPPING,
        "gradient_clipping": 0.5
    },
    "zero3_fp16_stepping": {
        "zero_optimization": {
            "stage": 3
        },
        "fp16": FP16_STEPPING
    },
    "zero2_offload_fp32_clip": {
        "zero_optimization": {
            "stage": 2,
            "offload_optimizer": {
                "device": "cpu"
            }
        },
        "zero_force_ds_cpu_optimizer": False,
        "gradient_clipping": 0.5,
    },
    "zero3_offload_fp32_clip": {
        "zero_optimization": {
            "stage": 3,
            "offload_optimizer": {
                "device": "cpu"
            }
        },
        "zero_force_ds_cpu_optimizer": False,
        "gradient_clipping": 0.5,
    },
    "zero1_muon_clip": {
        "zero_optimization": {
            "stage": 1
        },
        "optimizer": MUON,
        "gradient_clipping": 0.5,
    },
    "zero2_muon_clip": {
        "zero_optimization": {
            "stage": 2
        },
        "optimizer": MUON,
        "gradient_clipping": 0.5,
    },
    "zero2_offload_muon_clip": {
        "zero_optimization": {
            "stage": 2,
            "offload_optimizer": {
                "device": "cpu"
            }
        },
        "optimizer": MUON,
        "zero_force_ds_cpu_optimizer": False,
        "gradient_clipping": 0.5,
    },
    "zero3_muon_clip": {
        "zero_optimization": {
            "stage": 3,
            "reduce_scatter": False  # ZeRO-3 refuses Muon with reduce-scatter
        },
        "optimizer": MUON,
        "gradient_clipping": 0.5,
    },
}
PIPELINE = "pipe2_zero1_fp32_clip"  # 2 stages x (world size / 2) data-parallel ranks
# One MoE layer of 2 experts, expert parallel 2: rank r holds expert r % 2 (tests/helpers/moe_model.py).
MOE = "moe2_zero2_fp32_clip"
# Their configurations beside CONFIGS', by the stage their names say.
MODEL_CONFIGS = {
    PIPELINE: {
        "zero_optimization": {
            "stage": 1
        },
        "gradient_clipping": 0.5
    },
    MOE: {
        "zero_optimization": {
            "stage": 2
        },
        "gradient_clipping": 0.5
    },
}
UNIVERSAL = ("zero1_fp32_clip", "zero2_fp32_clip")  # converted with ds_to_universal by the test


def data_parallel_size(case):
    return dist.get_world_size() // (2 if case == PIPELINE else 1)


def config(case):
    extra = CONFIGS[case] if case in CONFIGS else MODEL_CONFIGS[case]
    return dict(
        {
            "train_micro_batch_size_per_gpu": MICRO,
            "gradient_accumulation_steps": GLOBAL // (MICRO * data_parallel_size(case)),
            "optimizer": ADAM,
            "scheduler": WARMUP,
            "steps_per_print": 1000,
        }, **extra)


def dtype_of(case):
    cfg = config(case)
    if cfg.get("fp16", {}).get("enabled"):
        return torch.float16
    if cfg.get("bf16", {}).get("enabled"):
        return torch.bfloat16
    return torch.float32


def batch(step, micro, rank, gas, dtype):
    """The micro-batch ``micro`` of global step ``step`` for data-parallel ``rank`` at ``gas``: part ``rank`` x GAS +
    ``micro`` of the step's global batch, the same on every install and any number of ranks."""
    gen = torch.Generator().manual_seed(1000 * step + 10 * (rank * gas + micro))
    return torch.randn(MICRO, IN, generator=gen).to(dtype), (torch.randn(MICRO, OUT, generator=gen) * 3).to(dtype)


def build(case, seed, load_universal=False, reshard=False):
    cfg = config(case)
    if load_universal:
        cfg["checkpoint"] = {"load_universal": True}
    if reshard:
        cfg["checkpoint"] = {"reshard_on_load": True}
    parameters = None
    if case == PIPELINE:
        from deepspeed.pipe import PipelineModule
        model = PipelineModule(layers=make_layers(seed), num_stages=2, loss_fn=mse, partition_method="uniform")
    elif case == MOE:
        from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
        from helpers.moe_model import MoENet
        model = MoENet(ep_size=2, seed=seed)
        parameters = split_params_into_different_moe_groups_for_optimizer({
            "params": list(model.parameters()),
            "name": "dense"
        })
    else:
        model = torch.nn.Sequential(*make_layers(seed))
    for param in model.parameters():
        param.use_muon = param.ndim >= 2  # read by Muon only: the matrices take Muon's update, the biases Adam's
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=parameters or model.parameters(), config=cfg)
    return engine


def train_steps(engine, case, first, count, before=lambda step, micro, phase: None):
    """Global steps first .. first + count - 1; ``before(step, micro, phase)`` is called before each forward,
    backward and step (tests/workers/crash_resume.py kills a rank there)."""
    dtype = dtype_of(case)
    rank, gas = dist.get_rank(), engine.gradient_accumulation_steps()
    losses = []
    for step in range(first, first + count):
        if case == PIPELINE:
            # Both stages of a data-parallel replica see its micro-batches (the last one needs the targets).
            replica = engine.mpu.get_data_parallel_rank()
            data = iter([batch(step, micro, replica, gas, dtype) for micro in range(gas)])
            losses.append(float(engine.train_batch(data_iter=data)))
            continue
        for micro in range(gas):
            inputs, targets = batch(step, micro, rank, gas, dtype)
            before(step, micro, "forward")
            loss = mse(engine(inputs), targets)
            before(step, micro, "backward")
            engine.backward(loss)
            before(step, micro, "step")
            engine.step()
        losses.append(float(loss))
    return losses


def weights(engine):
    """Every parameter of the model as a flat fp32 list, from the optimizer's fp32 master copy.

    ZeRO-3 parameters are gathered; pipeline stages report their own layers (the test joins them).
    """
    from deepspeed.utils import safe_get_full_fp32_param
    values = []
    for _, param in sorted(engine.module.named_parameters()):
        full = safe_get_full_fp32_param(param)
        values += (full if full is not None else param.detach().float()).flatten().tolist()
    return values


def state(engine):
    """What a checkpoint must carry across: counters, learning rate and the loss scaler."""
    optimizer = engine.optimizer
    scaler = getattr(optimizer, "loss_scaler", None)
    return {
        "global_steps": engine.global_steps,
        "global_samples": engine.global_samples,
        "skipped_steps": engine.skipped_steps,
        "lr": engine.get_lr()[0],
        "scheduler_last_batch": engine.lr_scheduler.last_batch_iteration,
        "loss_scale": float(scaler.cur_scale) if scaler is not None and hasattr(scaler, "cur_scale") else None,
        "scaler_cur_iter": getattr(scaler, "cur_iter", None),
        "scaler_last_overflow_iter": getattr(scaler, "last_overflow_iter", None),
    }


def save_then_continue(case, ckpt_dir):

    def run():
        engine = build(case, seed=1234)
        before = train_steps(engine, case, 0, SAVE_AT)
        engine.save_checkpoint(str(Path(ckpt_dir) / case), tag=TAG)
        saved = state(engine)
        after = train_steps(engine, case, SAVE_AT, CONTINUE)
        result = {"state": saved, "losses": before + after, "weights": weights(engine)}
        engine.destroy()
        return result

    return run


def load_then_continue(case, ckpt_dir, universal=False, reshard=False):

    def run():
        # Other initial weights: all must come from the file.
        engine = build(case, seed=99, load_universal=universal, reshard=reshard)
        tag = "universal" if universal else TAG
        loaded, _ = engine.load_checkpoint(str(Path(ckpt_dir) / case), tag=tag)
        assert loaded is not None, f"load_checkpoint found nothing at {ckpt_dir}/{case} tag {tag}"
        restored = state(engine)
        # Whether a reshard went through the universal format: its copy is kept beside the checkpoint.
        universal_copy = (Path(ckpt_dir) / case / f"{TAG}_universal").is_dir()
        after = train_steps(engine, case, SAVE_AT, CONTINUE)
        result = {"state": restored, "losses": after, "weights": weights(engine), "universal_copy": universal_copy}
        engine.destroy()
        return result

    return run


def labelled(pairs):
    return [pair.split("=", 1) for pair in pairs]


def cases(args):
    """Non-pipeline configurations first, the pipeline last: its grid stays in deepspeed.utils.groups."""
    chosen = {}
    wanted = [name for name in args.configs.split(",") if name]
    unknown = sorted(set(wanted) - set(CONFIGS) - {PIPELINE, MOE})
    if unknown:
        raise SystemExit(f"--configs: unknown configuration(s) {unknown}")
    for group in (list(CONFIGS), [MOE], [PIPELINE]):
        for name in (name for name in group if not wanted or name in wanted):
            if args.save:
                chosen[f"save/{name}"] = save_then_continue(name, args.save)
            for label, path in labelled(args.resume):
                chosen[f"resume-{label}/{name}"] = load_then_continue(name, path)
            for label, path in labelled(args.universal):
                if name in UNIVERSAL:
                    chosen[f"universal-{label}/{name}"] = load_then_continue(name, path, universal=True)
            for label, path in labelled(args.reshard):
                chosen[f"reshard-{label}/{name}"] = load_then_continue(name, path, reshard=True)
    return chosen


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--save", help="write the checkpoints under this directory")
    parser.add_argument("--resume", action="append", default=[], help="LABEL=DIR: load the checkpoints there")
    parser.add_argument("--universal", action="append", default=[], help="LABEL=DIR: load their universal form")
    parser.add_argument("--reshard",
                        action="append",
                        default=[],
                        help="LABEL=DIR: load the checkpoints there with checkpoint.reshard_on_load")
    parser.add_argument("--configs", default="", help="comma-separated configurations (default: all)")
    args, _ = parser.parse_known_args()
    from deepspeed.accelerator import get_accelerator
    get_accelerator().is_fp16_supported = lambda: True  # the engine's fp16 paths are device-independent
    run_cases(cases(args))
