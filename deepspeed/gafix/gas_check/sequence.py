# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Ulysses sequence parallelism in the check (``ds_gas_check --sequence-parallel N``).

Sequence parallelism splits each sample's sequence over N ranks. The check trains a built-in self-attention model
(models.UlyssesModel) whose engine copy runs DeepSpeed's Ulysses ``DistributedAttention`` on each rank's chunk of
the sequence, and gives the engine ``deepspeed.runtime.sequence_parallel.parallel_state_sp`` as its mpu: N ranks per
sequence-parallel group (consecutive ranks), the ranks divided by N data-parallel. The fp64 reference trains the
same model on whole sequences. Two ways of writing the loss are in use, and each SP rank backpropagates:

* ``share``: its chunk's share of the samples' loss (its mean over its positions, over N), as DeepSpeed's
  ``vocab_parallel_cross_entropy(..., sp_group=...)`` and Megatron-DeepSpeed do: the engine must add the SP ranks'
  gradients.
* ``gathered``: the shares gathered over the SP group and summed, the same loss on every SP rank, as DeepSpeed's
  long-sequence (ALST) tutorial, the Hugging Face Trainer and accelerate do: the engine must average them.

Either way the mean over every rank's chunks is the global batch's mean. With ``"loss_normalization": "per_item"``
each rank passes its own chunks' loss sum and item count (a chunk of a sample is an item: equal chunks keep the
global item mean the batch's), whatever the recipe.
"""

from dataclasses import dataclass

import torch

import deepspeed.comm as dist

LOSSES = ("share", "gathered")
CHUNK = 4  # positions of each sample on each sequence-parallel rank
MAX_SIZE = 16  # the built-in model's 32 hidden features in 2 x N heads


class GatherSummingGradients(torch.autograd.Function):
    """``torch.distributed.nn.functional.all_gather`` of a 0-dim loss, as ALST's recipe calls it: the forward gathers
    every SP rank's value, the backward gives each rank its slot's gradient summed over the group. On deepspeed.comm:
    torch's fails on a gloo subgroup ("Global rank 0 is not part of group") when SP is less than the world."""

    @staticmethod
    def forward(ctx, value, group):
        ctx.group = group
        gathered = [torch.zeros_like(value) for _ in range(dist.get_world_size(group=group))]
        dist.all_gather(gathered, value.contiguous(), group=group)
        return torch.stack(gathered)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad[dist.get_rank(group=ctx.group)], None


@dataclass(frozen=True)
class SequenceParallel:
    size: int  # ranks per sequence-parallel group
    loss: str = "share"  # LOSSES

    def __post_init__(self):
        if self.size < 2:
            raise ValueError(f"--sequence-parallel {self.size}: at least 2 ranks share a sequence")
        if self.size > MAX_SIZE:
            raise ValueError(f"--sequence-parallel {self.size}: the built-in model's heads split over at most "
                             f"{MAX_SIZE} ranks")
        if self.loss not in LOSSES:
            raise ValueError(f"--sequence-parallel-loss {self.loss!r}: one of {', '.join(LOSSES)}")

    @property
    def length(self):
        """Positions of each sample of the built-in data."""
        return CHUNK * self.size

    def make_model(self):
        from .models import UlyssesModel
        return UlyssesModel(heads=2 * self.size)

    def batches(self, steps, global_batch):
        from .data import sequence_batches
        return sequence_batches(steps, global_batch, self.length)

    def data_world(self, world):
        """Ranks that hold different samples: one per sequence-parallel group."""
        return world // self.size

    def data_rank(self, rank):
        return rank // self.size

    def chunk(self, batch):
        """This rank's chunk of the sequence (dimension 1) of every tensor of ``batch``."""
        from .batches import positions
        rank = dist.get_rank() % self.size
        return positions(batch, rank * CHUNK, (rank + 1) * CHUNK)

    def attach(self, model):
        """The model the engine trains runs Ulysses' attention over this process's sequence-parallel group."""
        from deepspeed.runtime.sequence_parallel import parallel_state_sp
        for module in model.modules():
            if hasattr(module, "sequence_group"):
                module.sequence_group = parallel_state_sp.get_sequence_parallel_group()

    def mpu(self):
        """``parallel_state_sp`` with this process's groups (made once), told how the loss is written where the
        engine asks (0.19.8 has no such declaration: it assumes one recipe)."""
        from deepspeed.runtime.sequence_parallel import parallel_state_sp
        group = parallel_state_sp._SEQUENCE_PARALLEL_GROUP
        if group is None:
            parallel_state_sp.initialize_sequence_parallel(self.size)
        elif dist.get_world_size(group=group) != self.size:
            raise ValueError(f"--sequence-parallel {self.size}: this process's sequence-parallel groups have "
                             f"{dist.get_world_size(group=group)} ranks")
        if hasattr(parallel_state_sp, "set_sequence_parallel_loss"):
            parallel_state_sp.set_sequence_parallel_loss(self.loss)
        return parallel_state_sp

    def backpropagated(self, loss):
        """What this rank backpropagates for ``loss``, its chunk's mean loss over the micro-batch."""
        share = loss / self.size
        if self.loss == "share":
            return share
        from deepspeed.runtime.sequence_parallel import parallel_state_sp
        return GatherSummingGradients.apply(share, parallel_state_sp.get_sequence_parallel_group()).sum()

    def title(self):
        return f"sequence parallel {self.size} ({self.loss} loss)"
