# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The fp64 reference: plain PyTorch, one process, from the engine's own initial weights.

DeepSpeed's contract under gradient accumulation: the gradient of a step is the mean, over every
micro-batch of every data-parallel rank, of the gradient of that micro-batch's loss. The reference
computes exactly that, with the same micro-batches, in fp64. When each micro-batch holds the same
number of items and the loss is a mean over them, that is the mean over the global batch whatever the
split; when the item counts vary (padded tokens), it is not, and ``loss_normalization_gap`` says by
how much (a property of the loss and data, not of DeepSpeed).
"""

import copy
from dataclasses import dataclass, field

import torch

from .batches import batch_size, model_loss, rows, to
from .optimizers import Lion, MuonWithAdamW
from .ownership import slices


@dataclass
class ReferenceRun:
    norms: list = field(default_factory=list)  # the global grad norm of each step (before clipping)
    losses: list = field(default_factory=list)  # the mean micro-batch loss of each step
    # {name: the elements this rank owns (ownership.py), or the whole tensor} before the first step and after each
    weights: list = field(default_factory=list)


def reference_optimizer(params, optimizer_config):
    """The twin of the config's ``optimizer`` section: torch.optim's SGD, Adam, AdamW, Adagrad, or Lion and Muon
    (optimizers.py)."""
    kind = optimizer_config.get("type", "")
    args = dict(optimizer_config.get("params", {}))
    if kind.lower() == "sgd":
        keys = ("lr", "momentum", "dampening", "weight_decay", "nesterov")
        return torch.optim.SGD(params, **{k: args[k] for k in keys if k in args})
    if kind.lower() in ("adam", "adamw"):
        # DeepSpeed's "Adam" decouples weight decay (AdamW) unless adam_w_mode is false.
        decoupled = kind.lower() == "adamw" or args.get("adam_w_mode", True)
        keys = ("lr", "betas", "eps", "weight_decay")
        kwargs = {k: args[k] for k in keys if k in args}
        kwargs.setdefault("weight_decay", 0.0)
        return (torch.optim.AdamW if decoupled else torch.optim.Adam)(params, **kwargs)
    if kind.lower() == "adagrad":
        keys = ("lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps")
        return torch.optim.Adagrad(params, **{k: args[k] for k in keys if k in args})
    if kind.lower() == "lion":
        keys = ("lr", "betas", "weight_decay")
        return Lion(params, **{k: args[k] for k in keys if k in args})
    if kind.lower() == "muon":
        keys = ("lr", "momentum", "weight_decay", "betas", "eps", "muon_lr", "adam_lr", "ns_method")
        return MuonWithAdamW(params, **{k: args[k] for k in keys if k in args})
    raise ValueError(f"config key 'optimizer.type' is '{kind}': the fp64 reference knows SGD, Adam, AdamW, Adagrad, "
                     f"Lion and Muon (pass --optimizer sgd, adamw, adagrad, lion or muon to check with one of those)")


def reference_scheduler(optimizer, scheduler_config):
    """The twin of the config's ``scheduler`` section on the reference optimizer, as the engine builds it: a class of
    deepspeed.runtime.lr_schedules, else of torch.optim.lr_scheduler. The reference steps it once per step: the
    learning rate of step k is the same whatever the split, which is what an engine stepping it per micro-batch, or
    on a step it skipped, would break."""
    if not scheduler_config:
        return None
    if isinstance(optimizer, MuonWithAdamW):
        raise ValueError("config key 'scheduler' with Muon: the fp64 reference's Muon keeps its learning rates apart "
                         "from param_groups, where a schedule sets them (ds_gas_check leaves the schedule out)")
    from deepspeed.runtime import lr_schedules
    name = scheduler_config.get("type")
    kind = getattr(lr_schedules, str(name), None) or getattr(torch.optim.lr_scheduler, str(name), None)
    if kind is None:
        raise ValueError(f"config key 'scheduler.type' is '{name}': neither DeepSpeed's lr_schedules nor "
                         "torch.optim.lr_scheduler has it")
    return kind(optimizer, **scheduler_config.get("params", {}))


def global_norm(parameters):
    grads = [p.grad.detach().norm() for p in parameters if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack(grads)) if grads else torch.tensor(0.0, dtype=torch.float64)


def named_weights(model, owned_spans=None):
    """Every parameter, whole; or, with ``owned_spans`` ``{name: (start, stop)}``, the elements this rank owns."""
    if owned_spans is None:
        return {name: p.detach().clone() for name, p in model.named_parameters()}
    return slices(dict(model.named_parameters()), owned_spans)


def reference_run(model,
                  batches,
                  micro_batches,
                  optimizer_config,
                  clip,
                  loss_fn=None,
                  dtype=torch.float64,
                  device="cpu",
                  loss_scale=None,
                  owned_spans=None,
                  scheduler_config=None):
    """Train ``model`` on ``batches``, each split in ``micro_batches`` equal parts whose gradients are
    averaged, as the engine does over GAS x data-parallel ranks (1: the global batch at once).

    ``dtype`` float64 (the reference) or float32: the model runs in it. bfloat16/float16: plain PyTorch's
    mixed precision, the way the engine does it: forward and backward in ``dtype`` on ``device`` (the
    engine's: rounding depends on the kernels) with fp32 master weights, which the optimizer updates.
    bf16: each micro-batch's gradient is added in fp32 (bf16 accumulation, which a config can avoid, is
    reported by the check instead). fp16: on the loss times ``loss_scale``, the micro-batches' gradients
    summed in fp16 as a ``.half()`` model sums them (and every fp16 path of DeepSpeed: nothing configures
    it otherwise), then unscaled. A run in the engine's own precision shows how far rounding alone moves
    this model from the fp64 reference. ``owned_spans``: keep only this rank's elements of each step's weights
    (the run itself needs the whole model). ``scheduler_config``: the config's ``scheduler`` section, stepped after
    each step.
    """
    low_precision = dtype in (torch.bfloat16, torch.float16)
    master = model.to(torch.float32 if low_precision else dtype)
    master.train()
    work = copy.deepcopy(master).to(device, dtype) if low_precision else master
    params = [p for p in master.parameters() if p.requires_grad]
    work_params = [p for p in work.parameters() if p.requires_grad]
    optimizer = reference_optimizer(params, optimizer_config)
    scheduler = reference_scheduler(optimizer, scheduler_config)
    run = ReferenceRun(weights=[named_weights(master, owned_spans)])
    scale = float(loss_scale or 1.0) if dtype == torch.float16 else 1.0
    for batch in batches:
        batch = to(batch, device if low_precision else "cpu", dtype)
        size = batch_size(batch) // micro_batches
        while True:
            optimizer.zero_grad()
            total, finite = 0.0, True
            for k in range(micro_batches):
                loss = model_loss(work, rows(batch, k * size, (k + 1) * size), loss_fn)
                # fp16: as DeepSpeed's fp16 optimizers scale it, the loss in fp32 times the loss scale.
                (loss.float() * (scale / micro_batches) if dtype == torch.float16 else loss / micro_batches).backward()
                total += loss.item()
                if low_precision and (dtype == torch.bfloat16 or k == micro_batches - 1):
                    for p, w in zip(params, work_params):
                        if w.grad is not None:
                            grad = w.grad.float().to(p.device) / scale
                            # Only a scaled fp16 loss can overflow (a host read per tensor: fp16 alone).
                            finite = finite and (scale == 1.0 or bool(torch.isfinite(grad).all()))
                            p.grad = grad if p.grad is None else p.grad + grad
                            w.grad = None
            if finite or scale <= 1.0:
                break
            scale /= 2  # an fp16 overflow: a dynamic loss scaler halves the scale; the floor redoes the batch
        norm = global_norm(params).item()
        if clip > 0:
            # DeepSpeed's rule, as torch.nn.utils.clip_grad_norm_: scale when the norm exceeds clip.
            coef = clip / (norm + 1e-6)
            if coef < 1:
                for p in params:
                    if p.grad is not None:
                        p.grad.mul_(coef)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        if low_precision:
            with torch.no_grad():
                for p, w in zip(params, work_params):
                    w.copy_(p)
        run.norms.append(norm)
        run.losses.append(total / micro_batches)
        run.weights.append(named_weights(master, owned_spans))
    return run
