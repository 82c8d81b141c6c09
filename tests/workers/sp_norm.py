# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Rank worker: Ulysses sequence parallelism (``deepspeed.runtime.sequence_parallel.parallel_state_sp``
as the engine's mpu): the global grad norm and the update against fp64.

Sequence parallelism splits each sample's sequence over the SP ranks. The gradient path is what this
checks, so a small MLP stands for the model: each rank's micro-batch is its chunk. Two ways of writing
the loss, both in use, give each SP rank a different gradient:

* its share (``<path>_sp...``): every SP rank backpropagates its chunk's share of the sample's loss
  (its sum of squared errors over the global batch's element count), as DeepSpeed's
  ``vocab_parallel_cross_entropy(..., sp_group=...)`` and Megatron-DeepSpeed do. The SP ranks'
  gradients add up to the sample's: the engine must SUM over SP ranks, average over DP ranks only.
* ALST's recipe (``<path>_alst_sp...``): every SP rank gathers the shares (``GatherSummingGradients``,
  ``torch.distributed.nn.functional.all_gather``'s semantics) and backpropagates their sum, the same loss on every
  SP rank, as DeepSpeed's ALST tutorial, the Hugging Face Trainer and accelerate do. That gather's
  backward sums over the SP ranks, so each rank's gradient is SP times its share: the engine must
  average over SP ranks too.

Either way the sum over every rank and micro-batch of the shares is the fp64 mean over the global
batch, and DP x GAS averaging is undone by scaling with DP x GAS. Case names:
``<path>[_alst]_sp<sp>_m<micro>_g<gas>``.
"""

import copy
import os

import torch

import deepspeed
import deepspeed.comm as dist
from toolkit.collectives import train_step_counting_collectives
from helpers.engine_paths import relative_update_error
from helpers.checker_module import gas_check
from helpers.rank_cases import run_cases
from helpers.small_model import (SAMPLE_ITEMS, global_batch, make_layers, micro_batch_losses, micro_batches,
                                 rank_share, sample_items_loss_sum, sgd_config)

# ALST's gathered loss, as the checker writes it (pristine upstream: the repository's copy)
GatherSummingGradients = gas_check("sequence").GatherSummingGradients
GLOBAL_BATCH = 16
LR, CLIP = 0.1, 1.0
PATHS = {
    "zero0_fp32": {},
    "zero1_fp32": {
        "zero_optimization": {
            "stage": 1
        }
    },
    "zero2_fp32": {
        "zero_optimization": {
            "stage": 2
        }
    },
    "zero3_fp32": {
        "zero_optimization": {
            "stage": 3
        }
    },
    "zero3_allreduce_fp32": {
        "zero_optimization": {
            "stage": 3,
            "reduce_scatter": False
        }
    },
}

# "loss_normalization": "per_item" (path + PER_ITEM): each sample holds this many items (its squared
# error counted once per item); each rank passes its chunk's loss sum and count, and nothing else.
PER_ITEM = "_per_item"
# ALST's loss (path + ALST): the shares gathered over the SP group and summed, on every SP rank.
ALST = "_alst"
ITEMS = SAMPLE_ITEMS[:GLOBAL_BATCH]


def sequence_parallel_groups(sp):
    """``parallel_state_sp`` with its process-wide groups, made on first use."""
    from deepspeed.runtime.sequence_parallel import parallel_state_sp as sp_mpu
    if sp_mpu._SEQUENCE_PARALLEL_GROUP is None:
        sp_mpu.initialize_sequence_parallel(sp)
    return sp_mpu


def case(path, sp, micro, gas):

    def run():
        from deepspeed.utils import safe_get_full_fp32_param
        world = dist.get_world_size()
        dp = world // sp
        per_item = path.endswith(PER_ITEM)
        alst = path.endswith(ALST)
        sp_mpu = sequence_parallel_groups(sp)
        if hasattr(sp_mpu, "set_sequence_parallel_loss"):  # 0.19.8 has no such declaration
            sp_mpu.set_sequence_parallel_loss("gathered" if alst else "share")
        layers = make_layers()
        model = torch.nn.Sequential(*copy.deepcopy(layers))
        config = sgd_config(micro, gas, CLIP, LR)
        config.update(PATHS[path.removesuffix(PER_ITEM).removesuffix(ALST)])
        if per_item:
            config["loss_normalization"] = "per_item"
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config, mpu=sp_mpu)
        inputs, targets = global_batch(GLOBAL_BATCH)
        per_rank = GLOBAL_BATCH // world
        assert per_rank == micro * gas, f"{micro} x {gas} x {world} != {GLOBAL_BATCH}"
        x, y = rank_share(inputs, targets, dist.get_rank(), per_rank)
        elements = targets.numel()
        items = ITEMS[dist.get_rank() * per_rank:(dist.get_rank() + 1) * per_rank].split(micro)

        def chunk_loss(output, target):
            # The chunk's share of the global mean, times the DP x GAS average the engine applies.
            share = ((output - target)**2).sum() / elements * dp * gas
            if not alst:
                return share
            return GatherSummingGradients.apply(share, sp_mpu.get_sequence_parallel_group()).sum()

        losses = micro_batch_losses(engine, micro_batches(x, y, micro, gas), items, per_item, chunk_loss)
        step = train_step_counting_collectives(engine, losses)
        after = [(safe_get_full_fp32_param(p) if engine.zero_optimization() else p).detach().double()
                 for p in engine.module.parameters()]
        engine.destroy()

        reference = torch.nn.Sequential(*copy.deepcopy(layers)).double()
        before = [p.detach().clone() for p in reference.parameters()]
        if per_item:
            total, count = sample_items_loss_sum(reference(inputs.double()), targets, ITEMS)
            (total / count).backward()
        else:
            torch.nn.functional.mse_loss(reference(inputs.double()), targets.double()).backward()
        grads = [p.grad for p in reference.parameters()]
        reference_norm = float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads])))
        coef = min(1.0, CLIP / (reference_norm + 1e-6))
        expected = [w - LR * coef * g for w, g in zip(before, grads)]
        return {
            **step,
            "reference_norm": reference_norm,
            "update_error": relative_update_error(after, expected, before),
        }

    return run


def refuses_per_item_with_a_gathered_loss():
    """loss_normalization "per_item" takes each rank's own loss sum and item count: with a gathered SP loss the
    engine refuses it, naming the key. Returns the error's message."""
    from deepspeed.runtime.config import DeepSpeedConfigError
    sp_mpu = sequence_parallel_groups(2)
    sp_mpu.set_sequence_parallel_loss("gathered")
    model = torch.nn.Sequential(*make_layers())
    config = {**sgd_config(1, 1, CLIP, LR), "zero_optimization": {"stage": 2}, "loss_normalization": "per_item"}
    try:
        deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config, mpu=sp_mpu)
    except DeepSpeedConfigError as error:
        return str(error)
    finally:
        sp_mpu.set_sequence_parallel_loss("share")
    return None


def splits(world):
    per_rank = GLOBAL_BATCH // world
    return [(per_rank, 1), (per_rank // 2, 2)]


if __name__ == "__main__":
    world = int(os.environ.get("WORLD_SIZE", "2"))
    run_cases({
        f"{path}_sp{sp}_m{m}_g{g}": case(path, sp, m, g)
        for path in list(PATHS) + [path + PER_ITEM for path in PATHS] + [path + ALST for path in PATHS]
        for sp in (2, )
        for m, g in splits(world)
    } | {"refuses_per_item_with_a_gathered_loss": refuses_per_item_with_a_gathered_loss})
