# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The global batches: every sample has its own target, so every micro-batch and rank has its own
mean gradient, and dropping, double-counting or not averaging one moves the result by O(1)."""

import torch

from .models import IN_FEATURES, OUT_FEATURES


def global_batches(steps, global_batch, seed=4321):
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(steps):
        inputs = torch.randn(global_batch, IN_FEATURES, generator=gen)
        # A per-sample offset on top of the noise keeps micro-batch means apart even for large batches.
        offsets = torch.linspace(-2.0, 2.0, global_batch).unsqueeze(1)
        targets = 3 * torch.randn(global_batch, OUT_FEATURES, generator=gen) + offsets
        batches.append((inputs, targets))
    return batches


def sequence_batches(steps, global_batch, length, seed=4321):
    """The built-in data under sequence parallelism: samples of ``length`` positions, each position its own target
    (over a per-sample offset, as ``global_batches``)."""
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(steps):
        inputs = torch.randn(global_batch, length, IN_FEATURES, generator=gen)
        offsets = torch.linspace(-2.0, 2.0, global_batch).view(-1, 1, 1)
        targets = 3 * torch.randn(global_batch, length, OUT_FEATURES, generator=gen) + offsets
        batches.append((inputs, targets))
    return batches


def loss_fn(outputs, targets):
    """Mean squared error in fp32 (outputs may be bf16/fp16): the mean over the micro-batch."""
    return torch.nn.functional.mse_loss(outputs.float(), targets.float())


POSITIONS = 12  # positions per sample of the variable-items data


def item_batches(steps, global_batch, seed=4321):
    """Global batches of samples with 0-12 labelled positions of 12 (``--items variable``): labels carry the
    targets and, in their last channel, the label mask, so an item is a labelled position. Long samples
    learn another target than short ones, so per-micro-batch means and the global item mean differ by O(1)."""
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(steps):
        inputs = torch.randn(global_batch, POSITIONS, IN_FEATURES, generator=gen)
        counts = torch.randint(0, POSITIONS + 1, (global_batch, ), generator=gen)
        targets = 3 * torch.randn(global_batch, POSITIONS, OUT_FEATURES, generator=gen)
        targets += counts.view(-1, 1, 1).float() / 2
        mask = (torch.arange(POSITIONS).view(1, -1) < counts.view(-1, 1)).float()
        batches.append((inputs, torch.cat([targets, mask.unsqueeze(-1)], dim=-1)))
    return batches


def item_loss_sum(outputs, labels):
    """(sum of the labelled positions' squared errors, mean over the outputs; how many positions), in fp32."""
    targets, mask = labels[..., :-1].float(), labels[..., -1].float()
    per_item = ((outputs.float() - targets)**2).mean(dim=-1)
    return (per_item * mask).sum(), mask.sum()


def item_mean_loss(outputs, labels):
    """Each micro-batch's mean over its own items: what a loss written for mean mode returns."""
    total, count = item_loss_sum(outputs, labels)
    return total / count.clamp(min=1)


def sample_loss_sum(outputs, targets):
    """The built-in fixed-items data under ``"loss_normalization": "per_item"``: each sample is one item
    (its mean squared error), so the global item mean is the global batch's mean."""
    per_sample = ((outputs.float() - targets.float())**2).flatten(1).mean(dim=1)
    return per_sample.sum(), per_sample.numel()
