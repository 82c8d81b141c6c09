# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Rank worker: AutoTP training (``tensor_parallel.autotp_size`` 2): the global grad norm and the
update against fp64 PyTorch on the unsplit model.

The MLP of helpers/small_model.py with its first linear column-parallel (``LinearLayer``: weight and
bias split by rows) and its second row-parallel (``LinearAllreduce``: weight split by columns, bias
replicated), the last linear replicated, as AutoTP shards a transformer's MLP. Split parameters must
count per shard, replicated ones once. Case names: ``<path>_m<micro>_g<gas>``; one global batch of 8.
"""

import copy
import os

import torch  # noqa: E402

import deepspeed  # noqa: E402
import deepspeed.comm as dist  # noqa: E402
from toolkit.collectives import train_step_counting_collectives  # noqa: E402
from helpers.engine_paths import relative_update_error  # noqa: E402
from helpers.rank_cases import run_cases  # noqa: E402
from helpers.small_model import (
    SAMPLE_ITEMS,
    global_batch,
    make_layers,
    micro_batch_losses,
    micro_batches,
    rank_share,  # noqa: E402
    sample_items_loss_sum,
    sgd_config)

GLOBAL_BATCH, TP = 8, 2
LR, CLIP = 0.1, 1.0
COLUMN, ROW = 0, 2  # indices in make_layers()
# With tp_overlap_comm the last two linears are split instead, so that the column-parallel layer's input gradient (the
# all-reduce it overlaps) reaches a layer before it.
OVERLAP_COLUMN, OVERLAP_ROW = 2, 4
PATHS = {"zero0_fp32": 0, "zero1_fp32": 1, "zero2_fp32": 2}
# "loss_normalization": "per_item" (path + PER_ITEM): each sample holds this many items (its squared
# error counted once per item); every TP rank of a data-parallel rank counts the same micro-batch.
PER_ITEM = "_per_item"
ITEMS = SAMPLE_ITEMS[:GLOBAL_BATCH]

# Activation checkpointing of the TP MLP (path + one of these): deepspeed.checkpointing configured from the engine's
# config with the TP group as its model-parallel group, as Megatron-style models do. The checkpointed blocks take
# activations every TP rank holds whole (the model's input, the row-parallel output): partition_activations keeps
# each rank's half between forward and backward and gathers them for the recomputation.
CHECKPOINTING = {
    "_ckpt_partitioned": {
        "partition_activations": True
    },
    "_ckpt_partitioned_cpu": {
        "partition_activations": True,
        "cpu_checkpointing": True
    },
    # Contiguous buffers hold one checkpoint's partitions of one size: the first block alone is checkpointed.
    "_ckpt_partitioned_contiguous": {
        "partition_activations": True,
        "contiguous_memory_optimization": True,
        "number_checkpoints": 1
    },
}

# tensor_parallel.tp_overlap_comm (path + this): the column-parallel layer's backward all-reduces its input gradient
# while it computes its weight gradient (layers OVERLAP_COLUMN, OVERLAP_ROW split).
OVERLAP = "_tp_overlap"


class CheckpointedMLP(torch.nn.Sequential):
    """make_layers()'s MLP with its TP block (column, tanh, row, tanh) and, unless ``first_only``, its last linear run
    through deepspeed.checkpointing.checkpoint; parameter names stay the Sequential's."""

    def __init__(self, layers, first_only):
        super().__init__(*layers)
        self.first_only = first_only

    def forward(self, x):
        # The reentrant checkpoint passes gradients to the block's parameters only through an input that needs them.
        x = deepspeed.checkpointing.checkpoint(lambda t: self[3](self[2](self[1](self[0](t)))), x.requires_grad_())
        return self[4](x) if self.first_only else deepspeed.checkpointing.checkpoint(self[4], x)


def config(stage, micro, gas, per_item=False, checkpointing=None, overlap=False):
    return {
        **({
            "activation_checkpointing": checkpointing
        } if checkpointing else {}),
        **({
            "loss_normalization": "per_item"
        } if per_item else {}),
        **sgd_config(micro, gas, CLIP, LR),
        "zero_optimization": {
            "stage": stage
        },
        # Layers are split by hand below; AutoTP's own pattern matching is told to leave them.
        "tensor_parallel": {
            "autotp_size": TP,
            "tp_overlap_comm": overlap,
            "partition_config": {
                "use_default_specs": False,
                "layer_specs": [{
                    "patterns": [".*\\.weight$"],
                    "partition_type": "skip"
                }]
            }
        },
    }


def shard(name, tensor, tp_rank, column=COLUMN, row=ROW):
    """This TP rank's part of the unsplit model's ``name`` (a parameter name of the Sequential)."""
    index, kind = int(name.split(".")[0]), name.split(".")[1]
    if index == column:
        return tensor.chunk(TP, dim=0)[tp_rank]
    if index == row and kind == "weight":
        return tensor.chunk(TP, dim=1)[tp_rank]
    return tensor


def case(path, micro, gas):

    def run():
        from deepspeed.module_inject.layers import LinearAllreduce, LinearLayer
        from deepspeed.utils import groups, safe_get_full_fp32_param
        overlap = path.endswith(OVERLAP)
        base = path.removesuffix(OVERLAP)
        checkpointing = next((suffix for suffix in CHECKPOINTING if base.endswith(suffix)), "")
        per_item = base.removesuffix(checkpointing).endswith(PER_ITEM)
        stage = PATHS[base.removesuffix(checkpointing).removesuffix(PER_ITEM)]
        cfg = config(stage, micro, gas, per_item, CHECKPOINTING.get(checkpointing), overlap)
        layers = make_layers()
        reference = torch.nn.Sequential(*copy.deepcopy(layers)).double()
        if checkpointing:
            model = CheckpointedMLP(copy.deepcopy(layers), first_only="contiguous" in checkpointing)
        else:
            model = torch.nn.Sequential(*copy.deepcopy(layers))
        # A first engine creates the TP groups (as upstream's AutoTP tests do), then the layers are split.
        warmup = torch.nn.Linear(4, 4)
        deepspeed.initialize(model=warmup, model_parameters=warmup.parameters(), config=cfg)[0].destroy()
        group = groups.get_tensor_model_parallel_group()
        column, row = (OVERLAP_COLUMN, OVERLAP_ROW) if overlap else (COLUMN, ROW)
        model[column] = LinearLayer(model[column], group)
        model[row] = LinearAllreduce(model[row], group)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        if checkpointing:
            deepspeed.checkpointing.configure(groups, deepspeed_config=cfg)
        tp_rank = dist.get_rank(group=group)
        dp_world = dist.get_world_size() // TP
        dp_rank = dist.get_rank(group=groups._get_data_parallel_group())

        inputs, targets = global_batch(GLOBAL_BATCH)
        per_rank = GLOBAL_BATCH // dp_world
        assert per_rank == micro * gas, f"{micro} x {gas} x {dp_world} data-parallel != {GLOBAL_BATCH}"
        x, y = rank_share(inputs, targets, dp_rank, per_rank)
        items = ITEMS[dp_rank * per_rank:(dp_rank + 1) * per_rank].split(micro)
        losses = micro_batch_losses(engine, micro_batches(x, y, micro, gas), items, per_item)
        step = train_step_counting_collectives(engine, losses)
        names = [name for name, _ in engine.module.named_parameters()]
        after = [(safe_get_full_fp32_param(p) if stage else p).detach().double() for p in engine.module.parameters()]
        engine.destroy()
        settings = {}
        if checkpointing:
            from deepspeed.runtime.activation_checkpointing import checkpointing as ckpt
            settings = {
                "partitioned": ckpt.PARTITION_ACTIVATIONS,
                "cpu": ckpt.CPU_CHECKPOINT,
                "contiguous": ckpt.CONTIGUOUS_CHECKPOINTING,
                "mp_size": ckpt.mp_size
            }

        if per_item:
            total, count = sample_items_loss_sum(reference(inputs.double()), targets, ITEMS)
            (total / count).backward()
        else:
            torch.nn.functional.mse_loss(reference(inputs.double()), targets.double()).backward()
        named = dict(reference.named_parameters())
        reference_norm = float(torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in named.values()])))
        coef = min(1.0, CLIP / (reference_norm + 1e-6))
        before = [shard(n, named[n].detach(), tp_rank, column, row) for n in names]
        expected = [shard(n, named[n].detach() - LR * coef * named[n].grad, tp_rank, column, row) for n in names]
        return {
            **step,
            "reference_norm": reference_norm,
            "update_error": relative_update_error(after, expected, before),
            "data_parallel_rank": dp_rank,
            "checkpointing": settings,
        }

    return run


def splits(world):
    per_rank = GLOBAL_BATCH // (world // TP)
    return [(per_rank, 1), (per_rank // 2, 2)]


if __name__ == "__main__":
    world = int(os.environ.get("WORLD_SIZE", "2"))
    paths = list(PATHS) + [path + PER_ITEM for path in PATHS] + [path + c for path in PATHS for c in CHECKPOINTING]
    paths += [path + OVERLAP for path in PATHS]
    run_cases({f"{path}_m{m}_g{g}": case(path, m, g) for path in paths for m, g in splits(world)})
