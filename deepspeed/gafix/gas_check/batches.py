# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The user's batches and loss: a batch is ``(inputs, labels)`` or a dict of tensors (as a Hugging Face
model takes them), split along dimension 0; the loss comes from a loss function, or from the model.
"""

import inspect

import torch


def check_batches(batches, source):
    """Validate a list of global batches; return the number of samples in each (the same for all)."""
    if not isinstance(batches, (list, tuple)) or not batches:
        raise ValueError(f"{source}: expected a non-empty list of batches, got {type(batches).__name__}")
    sizes = {batch_size(batch, f"{source}: batch {i}") for i, batch in enumerate(batches)}
    if len(sizes) != 1:
        raise ValueError(f"{source}: every global batch must hold the same number of samples, got {sorted(sizes)}")
    return sizes.pop()


def tensors_of(batch, where="batch"):
    if isinstance(batch, dict):
        items = list(batch.values())
    elif isinstance(batch, (tuple, list)) and len(batch) == 2:
        items = list(batch)
    else:
        raise ValueError(f"{where}: expected an (inputs, labels) tuple or a dict of tensors, got "
                         f"{type(batch).__name__}")
    if not all(torch.is_tensor(t) for t in items):
        raise ValueError(f"{where}: every element must be a tensor")
    if any(t.dim() == 0 for t in items):
        raise ValueError(f"{where}: a 0-dim tensor has no batch dimension")
    return items


def batch_size(batch, where="batch"):
    sizes = {t.shape[0] for t in tensors_of(batch, where)}
    if len(sizes) != 1:
        raise ValueError(f"{where}: the tensors disagree on the batch dimension (dim 0): {sorted(sizes)}")
    return sizes.pop()


def _map(batch, fn):
    if isinstance(batch, dict):
        return {key: fn(value) for key, value in batch.items()}
    return tuple(fn(value) for value in batch)


def rows(batch, start, stop):
    """Samples ``start:stop`` of every tensor."""
    return _map(batch, lambda t: t[start:stop])


def positions(batch, start, stop):
    """Positions ``start:stop`` (dimension 1) of every tensor."""
    return _map(batch, lambda t: t[:, start:stop].contiguous())


def to(batch, device, float_dtype):
    """Move to ``device``; floating tensors become ``float_dtype`` (integer ids and masks stay as they are)."""
    return _map(batch, lambda t: t.to(device, float_dtype if t.is_floating_point() else t.dtype))


def loss_of(output):
    """The scalar loss in a model's output: a 0-dim tensor, ``.loss`` (Hugging Face), ``["loss"]`` or ``[0]``."""
    if torch.is_tensor(output):
        loss = output
    elif getattr(output, "loss", None) is not None:
        loss = output.loss
    elif isinstance(output, dict) and "loss" in output:
        loss = output["loss"]
    elif isinstance(output, (tuple, list)) and output and torch.is_tensor(output[0]):
        loss = output[0]
    else:
        raise ValueError(f"the model returned {type(output).__name__}, not a loss: give --loss, or return the loss "
                         "(a 0-dim tensor, an output with .loss, a dict with 'loss')")
    if loss.dim() != 0:
        raise ValueError(f"the loss has shape {tuple(loss.shape)}: expected a scalar (a mean over the micro-batch)")
    return loss


def model_loss(model, batch, loss_fn=None):
    """The loss of ``model`` on ``batch``: ``loss_fn(model(inputs), labels)``, or the loss the model computes
    (``model(**batch)`` for a dict, ``model(inputs, labels)`` for a tuple)."""
    if isinstance(batch, dict):
        if loss_fn is None:
            return loss_of(model(**batch))
        if "labels" not in batch:
            raise ValueError("a dict batch with --loss needs a 'labels' entry (passed to the loss, not the model)")
        inputs = {key: value for key, value in batch.items() if key != "labels"}
        return loss_of(loss_fn(model(**inputs), batch["labels"]))
    inputs, labels = batch
    if loss_fn is None:
        return loss_of(model(inputs, labels))
    return loss_of(loss_fn(model(inputs), labels))


def call_data_factory(factory, steps, global_batch_size):
    """Call a ``--data`` factory with the keywords it declares (``steps``, ``global_batch_size``), or none."""
    wanted = inspect.signature(factory).parameters
    known = {"steps": steps, "global_batch_size": global_batch_size}
    unknown = [name for name, p in wanted.items() if name not in known and p.default is inspect.Parameter.empty]
    if unknown:
        raise ValueError(f"--data factory {factory.__name__}: takes {unknown}; it may take only steps and "
                         "global_batch_size (keywords), or nothing")
    return factory(**{name: value for name, value in known.items() if name in wanted})


def items_of(output, where="the loss"):
    """``(loss_sum, num_items)`` of a per-item loss (``"loss_normalization": "per_item"``), the count as a
    0-dim fp32 tensor."""
    if not (isinstance(output,
                       (tuple, list)) and len(output) == 2 and torch.is_tensor(output[0]) and output[0].dim() == 0):
        raise ValueError(
            f"{where} returned {type(output).__name__}: with \"loss_normalization\": \"per_item\" it must "
            "return (loss_sum, num_items), the sum of the micro-batch's per-item losses and their count")
    total, count = output
    return total, torch.as_tensor(count, dtype=torch.float32)


def model_item_loss(model, batch, loss_fn):
    """``(loss_sum, num_items)`` of ``model`` on ``batch`` from a per-item ``loss_fn(outputs, labels)``."""
    if loss_fn is None:
        raise ValueError("\"loss_normalization\": \"per_item\" needs --loss, a function returning (loss_sum, "
                         "num_items): a model's own loss is a mean")
    if isinstance(batch, dict):
        if "labels" not in batch:
            raise ValueError("a dict batch with --loss needs a 'labels' entry (passed to the loss, not the model)")
        inputs = {key: value for key, value in batch.items() if key != "labels"}
        return items_of(loss_fn(model(**inputs), batch["labels"]), "--loss")
    inputs, labels = batch
    return items_of(loss_fn(model(inputs), labels), "--loss")


def item_mean(loss_fn):
    """A per-item loss as the mean over its items: over a whole global batch, the global item mean."""

    def mean(outputs, labels):
        total, count = items_of(loss_fn(outputs, labels))
        return total / count.to(total.device)

    return mean
