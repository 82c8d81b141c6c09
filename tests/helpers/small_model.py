# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The small MLP and the batch that the engine workers train: the same layers and data for every
path, so each worker compares its engine with plain PyTorch on identical inputs."""

import torch

IN, HIDDEN, OUT = 8, 16, 4


def make_layers(seed=1234):
    torch.manual_seed(seed)
    return [
        torch.nn.Linear(IN, HIDDEN),
        torch.nn.Tanh(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.Tanh(),
        torch.nn.Linear(HIDDEN, OUT)
    ]


def global_batch(size, seed=4321):
    """Inputs and targets that give every sample, so every micro-batch and rank, a different gradient."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(size, IN, generator=gen), torch.randn(size, OUT, generator=gen) * 3


def mse(output, target):
    return torch.nn.functional.mse_loss(output.float(), target.float())


# Items per sample of a global batch (up to 16 samples), for "loss_normalization": "per_item": a sample's
# squared error counts once per item, so micro-batch means and the global item mean differ.
SAMPLE_ITEMS = torch.tensor([3, 0, 1, 2, 0, 2, 1, 3, 1, 1, 0, 2, 3, 0, 2, 1])


def sample_items_loss_sum(output, target, items):
    """(the samples' mean squared errors, each times its ``items``, summed; the items' count): what a
    micro-batch passes to ``engine.backward(loss, num_items=...)``, and over the whole batch the fp64
    reference's numerator and denominator."""
    errors = ((output - target.to(output.dtype))**2).mean(dim=1)
    return (errors * items.to(errors.dtype)).sum(), int(items.sum())


def micro_batch_losses(engine, batches, items, per_item, loss=mse):
    """Per micro-batch, lazily, ``(loss, engine.backward keyword arguments)`` (the ``losses`` of
    ``collectives.train_step_counting_collectives``): with ``per_item``, the micro-batch's loss sum over its
    ``items`` and ``num_items``; else ``loss(output, target)``."""
    for (batch, target), n in zip(batches, items):
        if per_item:
            total, count = sample_items_loss_sum(engine(batch).float(), target, n)
            yield total, {"num_items": count}
        else:
            yield loss(engine(batch), target), {}


def rank_share(inputs, targets, rank, per_rank):
    """The ``per_rank`` samples of ``rank``, in order."""
    return inputs[rank * per_rank:(rank + 1) * per_rank], targets[rank * per_rank:(rank + 1) * per_rank]


def micro_batches(inputs, targets, micro, count, dtype=None):
    """``count`` consecutive (inputs, targets) micro-batches of ``micro`` samples, cast to ``dtype``."""
    batches = [(inputs[i * micro:(i + 1) * micro], targets[i * micro:(i + 1) * micro]) for i in range(count)]
    return batches if dtype is None else [(x.to(dtype), y.to(dtype)) for x, y in batches]


def sgd_config(micro, gas, clip, lr):
    """The engine config the workers train the small model with: plain SGD (ZeRO allows it untested),
    ``micro`` x ``gas`` per rank, ``gradient_clipping`` ``clip`` (0.0: off, not the 1.0 default)."""
    return {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": gas,
        "optimizer": {
            "type": "SGD",
            "params": {
                "lr": lr
            }
        },
        "zero_allow_untested_optimizer": True,
        "gradient_clipping": clip,
    }
