# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The part of every fp32 master weight a rank owns, and nothing more.

A check keeps the weights of every step of every split; on a real model, full copies on every rank
would cost many times the engine's own memory. So each rank keeps the elements it owns, as ranges of
each parameter's flattened tensor:

- ZeRO-3: the rank's partition of the fp32 master (``safe_get_local_fp32_param``);
- ZeRO-1/2 and BF16_Optimizer: the rank's fragment of the fp32 master (the ``_hp_mapping`` that
  ``safe_get_full_fp32_param`` reads, without its all-reduce);
- otherwise (no partitioned optimizer: every data-parallel rank holds the whole parameter): an equal
  share of it by data-parallel rank.

Every element of every trainable parameter is owned by exactly one rank of the job (pipeline stages hold
different layers; their data-parallel ranks share them out), so sums over owned elements, all-reduced,
are sums over the model; ``check_coverage`` verifies it. Frozen parameters are left out: nothing moves them.
"""

import torch
from torch._utils import _unflatten_dense_tensors

import deepspeed.comm as dist
from deepspeed.accelerator import get_accelerator
from deepspeed.utils import safe_get_local_fp32_param


def low_to_master(optimizer):
    """fp16 without ZeRO keeps fp32 copies beside the fp16 parameters: FP16_UnfusedOptimizer one per
    parameter, FP16_Optimizer (fused optimizers) one flat buffer per group."""
    masters = {}
    for low, high in zip(getattr(optimizer, "fp16_groups", []), getattr(optimizer, "fp32_groups", [])):
        masters.update({id(p): q for p, q in zip(low, high)})
    for low, flat in zip(getattr(optimizer, "fp16_groups", []), getattr(optimizer, "fp32_groups_flat", [])):
        masters.update({id(p): q for p, q in zip(low, _unflatten_dense_tensors(flat, low))})
    return masters


def share(numel, rank, world):
    """``(start, stop)``: rank ``rank``'s equal share of ``numel`` elements (the last shares may be short)."""
    size = -(-numel // world)
    return min(rank * size, numel), min((rank + 1) * size, numel)


def owned_masters(engine, dp_rank, dp_world):
    """``{name: (start, fp32 tensor)}``: this rank's elements of each trainable parameter's fp32 master, flattened,
    copied to the host. ``dp_rank``/``dp_world``: the rank in its data-parallel group (pipeline: in its stage's)."""
    masters = None
    owned = {}
    for name, param in engine.module.named_parameters():
        if not param.requires_grad:
            continue
        if hasattr(param, "ds_id"):  # ZeRO-3: the partition, padded on the last rank
            rank = dist.get_rank(group=param.ds_process_group)
            start = rank * param.partition_numel()
            stop = min(start + param.partition_numel(), param.ds_numel)
            if stop <= start:
                continue
            local = safe_get_local_fp32_param(param).flatten()[:stop - start]
        elif hasattr(param, "_hp_mapping"):  # ZeRO-1/2, BF16_Optimizer: this rank's fragment, or none
            if param._hp_mapping is None:
                continue
            start = param._hp_mapping.lp_fragment_address.start
            local = param._hp_mapping.get_hp_fragment().flatten()
        else:
            if masters is None:
                masters = low_to_master(engine.optimizer)
            start, stop = share(param.numel(), dp_rank, dp_world)
            if stop <= start:
                continue
            local = masters.get(id(param), param).detach().flatten()[start:stop]
        owned[name] = (start, local.detach().to("cpu", torch.float32).clone())
    return owned


def spans(owned):
    """``{name: (start, stop)}`` of ``owned_masters``' result."""
    return {name: (start, start + tensor.numel()) for name, (start, tensor) in owned.items()}


def values(owned):
    """``{name: tensor}`` of ``owned_masters``' result."""
    return {name: tensor for name, (_, tensor) in owned.items()}


def slices(named_tensors, owned_spans, dtype=None):
    """The owned elements of full tensors (a reference model's), ``{name: flat tensor}``, copied to the host."""
    kept = {}
    for name, (start, stop) in owned_spans.items():
        tensor = named_tensors[name].detach().flatten()[start:stop]
        kept[name] = tensor.to("cpu", dtype or tensor.dtype).clone()
    return kept


def _all_reduce(tensor):
    device = get_accelerator().current_device_name()
    moved = tensor.to(device)
    dist.all_reduce(moved)
    return moved.cpu()


def sum_over_ranks(values):
    """``values`` (floats) summed over every rank, in fp64: one collective."""
    return _all_reduce(torch.tensor(values, dtype=torch.float64)).tolist()


def check_coverage(owned_spans, total):
    """Raise unless the ranks' owned elements add up to the model's ``total`` trainable elements (each owned once)."""
    counted = sum_over_ranks([float(sum(stop - start for start, stop in owned_spans.values()))])[0]
    if int(counted) != int(total):
        raise ValueError(f"the ranks own {int(counted)} elements of the model's {int(total)} trainable ones: a layout "
                         "the check does not know (tensor or expert parallelism?) holds the same names on several "
                         "ranks")


def load_full(model, owned, source):
    """Set ``model``'s parameters from every rank's owned elements: one all-reduce per parameter, in the order of
    ``model.named_parameters()`` (the same on every rank); the transient is one full parameter."""
    params = dict(model.named_parameters())
    wrong = [f"{name} (not in the reference model)" for name in owned if name not in params]
    wrong += [
        f"{name} ({params[name].numel()} elements in the reference model, more in the engine)"
        for name, (start, tensor) in owned.items() if name in params and start + tensor.numel() > params[name].numel()
    ]
    # Every rank decides together: one raising alone would leave the others waiting in the next collective.
    if sum_over_ranks([float(len(wrong))])[0]:
        raise ValueError(f"{source}: the reference model must have the engine's parameter names and shapes"
                         f"{': ' + ', '.join(wrong[:3]) if wrong else ' (another rank found a difference)'}")
    with torch.no_grad():
        for name, param in params.items():
            buffer = torch.zeros(param.numel(), dtype=torch.float64)
            if name in owned:
                start, tensor = owned[name]
                buffer[start:start + tensor.numel()] = tensor.double()
            full = _all_reduce(buffer)
            if param.requires_grad:
                param.copy_(full.view_as(param).to(param.dtype))
