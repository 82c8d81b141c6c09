# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Rank worker: fp16's dynamic loss scale settings (hysteresis, consecutive_hysteresis, min_loss_scale) with
overflowing steps, on every ZeRO stage and at two micro-batch x GAS splits.

Each case trains 8 steps of the same global batches; in the steps of ``POISONED`` one micro-batch of rank 1 has an
inf loss. It reports the loss scale after every step, the engine's skipped-step count and the fp32 master weights, and
the same engine's weights after the 5 clean steps alone: a skipped step must leave no trace in the weights.
"""

import torch

import deepspeed  # noqa: E402
import deepspeed.comm as dist  # noqa: E402

from helpers.master_weights import zero_master_weights  # noqa: E402
from helpers.rank_cases import force_fp16_on_cpu, run_cases  # noqa: E402
from helpers.small_model import global_batch, make_layers, mse, rank_share  # noqa: E402

STEPS = 8
POISONED = (1, 2, 4)
PER_RANK = 8
SPLITS = ((8, 1), (2, 4))
# Under ZeRO an overflow halves the scale only once the hysteresis is used up (without ZeRO at every overflow); the
# scale grows after loss_scale_window clean steps; it never falls below min_loss_scale (held there at the third
# overflow without consecutive_hysteresis).
SETTINGS = {
    "hysteresis": {
        "hysteresis": 2,
        "consecutive_hysteresis": False,
        "min_loss_scale": 100
    },
    "consecutive_hysteresis": {
        "hysteresis": 2,
        "consecutive_hysteresis": True,
        "min_loss_scale": 100
    },
}


def config(stage, settings, micro, gas):
    return {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": 0.5,
        "zero_allow_untested_optimizer": True,
        "optimizer": {
            "type": "SGD",
            "params": {
                "lr": 0.1
            }
        },
        "fp16": {
            "enabled": True,
            "loss_scale": 0,
            "initial_scale_power": 8,
            "loss_scale_window": 2,
            **settings
        },
        "zero_optimization": {
            "stage": stage
        },
    }


def train(stage, settings, micro, gas, steps):
    """Train ``steps`` (step indices: the data of step i is the same whichever steps run); return the loss scale
    after each, the skipped-step count and the master weights."""
    model = torch.nn.Sequential(*make_layers())
    engine, *_ = deepspeed.initialize(model=model,
                                      model_parameters=model.parameters(),
                                      config=config(stage, settings, micro, gas))
    rank = dist.get_rank()
    scales = []
    for step in steps:
        inputs, targets = rank_share(*global_batch(PER_RANK * dist.get_world_size(), seed=100 + step), rank, PER_RANK)
        for m in range(gas):
            batch = slice(m * micro, (m + 1) * micro)
            loss = mse(engine(inputs[batch].to(engine.device, torch.half)), targets[batch].to(engine.device))
            if step in POISONED and rank == 1 and m == gas - 1:
                loss = loss * float("inf")
            engine.backward(loss)
            engine.step()
        scales.append(float(engine.optimizer.loss_scale))
    weights = {name: w.flatten().tolist() for name, w in zero_master_weights(engine).items()}
    result = {"scales": scales, "skipped": engine.skipped_steps, "global_steps": engine.global_steps}
    engine.destroy()
    return result, weights


def case(stage, settings):
    results = {}
    for micro, gas in SPLITS:
        poisoned, weights = train(stage, SETTINGS[settings], micro, gas, range(STEPS))
        clean = [step for step in range(STEPS) if step not in POISONED]
        _, clean_weights = train(stage, SETTINGS[settings], micro, gas, clean)
        results[f"{micro}x{gas}"] = dict(poisoned, weights=weights, clean_weights=clean_weights)
    return results


def floor_overflow(stage):
    """An overflow with the scale at min_loss_scale and the hysteresis used up: what the engine does."""
    settings = {"hysteresis": 1, "min_loss_scale": 128}  # 256 -> 128 at the first overflow, the floor at the second
    model = torch.nn.Sequential(*make_layers())
    engine, *_ = deepspeed.initialize(model=model,
                                      model_parameters=model.parameters(),
                                      config=config(stage, settings, PER_RANK, 1))
    inputs, targets = rank_share(*global_batch(PER_RANK * dist.get_world_size()), dist.get_rank(), PER_RANK)
    scales = []
    try:
        for _ in range(2):
            loss = mse(engine(inputs.to(engine.device, torch.half)), targets.to(engine.device))
            engine.backward(loss * float("inf") if dist.get_rank() == 1 else loss)
            engine.step()
            scales.append(float(engine.optimizer.loss_scale))
        outcome = "stepped"
    except Exception as error:  # the engine's own exception at the floor
        outcome = f"{type(error).__name__}: {error}"
    result = {"scales": scales, "skipped": engine.skipped_steps, "outcome": outcome}
    engine.destroy()
    return result


CASES = {
    f"zero{stage}_{settings}": (lambda stage=stage, settings=settings: case(stage, settings))
    for stage in range(4)
    for settings in SETTINGS
}
CASES.update({f"zero{stage}_floor": (lambda stage=stage: floor_overflow(stage)) for stage in range(4)})

if __name__ == "__main__":
    force_fp16_on_cpu()
    run_cases(CASES)
