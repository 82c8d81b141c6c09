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


def loss_fn(outputs, targets):
    """Mean squared error in fp32 (outputs may be bf16/fp16): the mean over the micro-batch."""
    return torch.nn.functional.mse_loss(outputs.float(), targets.float())
