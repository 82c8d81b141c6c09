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
import inspect
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
        adam = torch.optim.AdamW if decoupled else torch.optim.Adam
        # Where the config sets no weight_decay, the engine's optimizer keeps its own default: 0 in DeepSpeed's
        # fused and CPU Adam, torch's (0.01 for AdamW) with torch_adam, where the engine builds torch's class.
        kwargs.setdefault(
            "weight_decay",
            inspect.signature(adam).parameters["weight_decay"].default if args.get("torch_adam") else 0.0)
        return adam(params, **kwargs)
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


def at_least_fp32(tensor):
    """``tensor`` detached, in fp32 where it is held in less (low-precision master weights and their gradients)."""
    return tensor.detach().float() if tensor.element_size() < 4 else tensor.detach()


def global_norm(parameters):
    # Low-precision gradients' norm in fp32, as the engine's: their own dtype would round it.
    grads = [at_least_fp32(p.grad).norm() for p in parameters if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack(grads)) if grads else torch.tensor(0.0, dtype=torch.float64)


def named_weights(model, owned_spans=None):
    """Every parameter, whole; or, with ``owned_spans`` ``{name: (start, stop)}``, the elements this rank owns."""
    # Low-precision master weights (MasterStorage) are kept as fp32 copies: an update is their difference.
    tensors = {name: at_least_fp32(p) for name, p in model.named_parameters()}
    if owned_spans is None:
        return {name: tensor.clone() for name, tensor in tensors.items()}
    return slices(tensors, owned_spans)


@dataclass(frozen=True)
class MasterStorage:
    """Master weights and gradients stored in ``dtype`` (``bf16_master_weights_and_grads``,
    ``fp16_master_weights_and_grads``). ``fp32_step``: the engine's optimizer computes in fp32 and rounds what it
    stores (DeepSpeed's fused and CPU Adam, Lion, CPU Adagrad); otherwise a torch optimizer steps the ``dtype``
    tensors (whose kernels round a scalar such as the learning rate to ``dtype`` too). ``state_dtype``
    (``bf16_optimizer_states``): an fp32 step's states are stored in it. ``ranks``: data-parallel ranks, each holding
    consecutive micro-batches (micro_batch_order)."""
    dtype: torch.dtype
    fp32_step: bool
    state_dtype: torch.dtype = None
    ranks: int = 1
    reduce_per_micro_batch: bool = False  # ZeRO-2/3: each micro-batch's gradient is reduced as its backward ends


class Fp32Step:
    """A torch optimizer stepping fp32 copies of low-precision parameters, whose results are stored back rounded: an
    fp32 step (MasterStorage), its states rounded to ``state_dtype`` when one is given."""

    def __init__(self, params, make_optimizer, state_dtype=None):
        self.params = params
        self.copies = [p.detach().float().requires_grad_() for p in params]
        self.optimizer = make_optimizer(self.copies)
        self.state_dtype = state_dtype

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        for p, copy_ in zip(self.params, self.copies):
            copy_.copy_(p)
            copy_.grad = None if p.grad is None else p.grad.float()
        self.optimizer.step()
        for p, copy_ in zip(self.params, self.copies):
            p.copy_(copy_)
        if self.state_dtype is not None:
            for state in self.optimizer.state.values():
                for value in state.values():
                    if torch.is_tensor(value) and value.is_floating_point() and value.dim() > 0:
                        value.copy_(value.to(self.state_dtype))


def micro_batch_order(micro_batches, storage):
    """The order a run adds its micro-batches' gradients in, and how many of them make one partial sum before it is
    added to the step's gradient. Rank r holds micro-batches r x GAS to (r + 1) x GAS - 1 (the check deals them so).
    With gradients stored in low precision the order rounds: ZeRO-1 sums each rank's own micro-batches, then the
    ranks' sums (its reduction at the boundary); ZeRO-2/3 reduce each micro-batch over the ranks as its backward
    ends and add that to the partition's gradient."""
    if storage is None or storage.ranks <= 1:
        return list(range(micro_batches)), micro_batches if storage is None else 1
    gas = micro_batches // storage.ranks
    if storage.reduce_per_micro_batch:
        return [rank * gas + j for j in range(gas) for rank in range(storage.ranks)], storage.ranks
    return list(range(micro_batches)), gas


def added(total, grad, dtype):
    """``total + grad`` stored in ``dtype`` (``grad`` where there is no total yet)."""
    return grad.to(dtype) if total is None else (total + grad).to(dtype)


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
                  scheduler_config=None,
                  master_storage=None):
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
    each step. ``master_storage`` (MasterStorage): the master weights and gradients kept in low precision, with
    a low-precision run only.
    """
    low_precision = dtype in (torch.bfloat16, torch.float16)
    storage = master_storage if low_precision else None
    master, work = master_and_work(model, dtype, device, storage)
    params = [p for p in master.parameters() if p.requires_grad]
    work_params = [p for p in work.parameters() if p.requires_grad]
    optimizer, scheduler = optimizer_and_scheduler(params, optimizer_config, scheduler_config, storage)
    run = ReferenceRun(weights=[named_weights(master, owned_spans)])
    scale = float(loss_scale or 1.0) if dtype == torch.float16 else 1.0
    order, flush_every = micro_batch_order(micro_batches, storage)
    for batch in batches:
        batch = to(batch, device if low_precision else "cpu", dtype)
        size = batch_size(batch) // micro_batches
        while True:
            optimizer.zero_grad()
            total, finite, partial = 0.0, True, {}
            for position, k in enumerate(order):
                micro_batch = rows(batch, k * size, (k + 1) * size)
                total += backward(work, micro_batch, loss_fn, micro_batches, scale if dtype == torch.float16 else None)
                if low_precision and (dtype == torch.bfloat16 or position == micro_batches - 1):
                    finite = to_master(params, work_params, scale, storage, partial, (position + 1) % flush_every == 0,
                                       finite)
            if finite or scale <= 1.0:
                break
            scale /= 2  # an fp16 overflow: a dynamic loss scaler halves the scale; the floor redoes the batch
        norm = global_norm(params).item()
        clip_gradients(params, norm, clip)
        step(optimizer, scheduler, params, work_params if low_precision else ())
        run.norms.append(norm)
        run.losses.append(total / micro_batches)
        run.weights.append(named_weights(master, owned_spans))
    return run


def backward(work, micro_batch, loss_fn, micro_batches, fp16_scale=None):
    """The micro-batch's loss; its gradient over ``micro_batches`` added to ``work``'s. ``fp16_scale``: an fp16 run's
    loss scale, which multiplies the loss in fp32, as DeepSpeed's fp16 optimizers scale it."""
    loss = model_loss(work, micro_batch, loss_fn)
    (loss / micro_batches if fp16_scale is None else loss.float() * (fp16_scale / micro_batches)).backward()
    return loss.item()


def step(optimizer, scheduler, params, work_params):
    """The optimizer's and the scheduler's step; the work copy (``work_params``, a low-precision run's) takes the
    updated weights."""
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    with torch.no_grad():
        for p, w in zip(params, work_params):
            w.copy_(p)


def master_and_work(model, dtype, device, storage):
    """The weights the optimizer updates (fp32 for a low-precision run, in ``storage``'s dtype where it keeps them
    lower) and the copy forward and backward run on (in ``dtype`` on ``device``; the same module otherwise)."""
    low_precision = dtype in (torch.bfloat16, torch.float16)
    master = model.to(torch.float32 if low_precision else dtype)
    master.train()
    work = copy.deepcopy(master).to(device, dtype) if low_precision else master
    if storage is not None:
        master.to(storage.dtype)
    return master, work


def optimizer_and_scheduler(params, optimizer_config, scheduler_config, storage):
    if storage is not None and storage.fp32_step:
        optimizer = Fp32Step(params, lambda copies: reference_optimizer(copies, optimizer_config), storage.state_dtype)
        return optimizer, reference_scheduler(optimizer.optimizer, scheduler_config)
    optimizer = reference_optimizer(params, optimizer_config)
    return optimizer, reference_scheduler(optimizer, scheduler_config)


def to_master(params, work_params, scale, storage, partial, flush, finite):
    """Move the work copy's gradients, unscaled, onto the master weights, as mixed precision does; whether every
    gradient so far was finite (``finite``: the batch's until now). With gradients stored in low precision
    (``storage``) they are summed into ``partial`` in the engine's order, each addition rounded where the engine's is,
    and ``flush`` adds the partial sums to the step's gradient."""
    for i, (p, w) in enumerate(zip(params, work_params)):
        if w.grad is None:
            continue
        grad = w.grad.float().to(p.device) / scale
        # Only a scaled fp16 loss can overflow (a host read per tensor: fp16 alone).
        finite = finite and (scale == 1.0 or bool(torch.isfinite(grad).all()))
        if storage is None:
            p.grad = grad if p.grad is None else p.grad + grad
        else:
            partial[i] = added(partial.get(i), grad, storage.dtype)
            if flush:
                p.grad = added(p.grad, partial.pop(i), storage.dtype)
        w.grad = None
    return finite


def clip_gradients(params, norm, clip):
    """DeepSpeed's rule, as torch.nn.utils.clip_grad_norm_: scale the gradients when their norm exceeds ``clip``."""
    if clip > 0:
        coef = clip / (norm + 1e-6)
        if coef < 1:
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(coef)
