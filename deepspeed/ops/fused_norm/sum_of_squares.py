# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team

import functools
import warnings
from dataclasses import dataclass
from typing import Iterable, Optional

import torch

IMPLEMENTATIONS = ("auto", "op", "torch")
_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


@dataclass(frozen=True)
class SumOfSquares:
    """``total``: 0-dim float64 sum of the squares of every element; ``nonfinite``: 0-dim bool, True
    when an element is inf or nan; ``per_tensor``: float64 per input tensor (in input order) when
    asked for, else None. All on ``device``."""
    total: torch.Tensor
    nonfinite: torch.Tensor
    per_tensor: Optional[torch.Tensor]


class SumOfSquaresPlan:
    """What the op works out about a set of tensors, kept for the next call on the same set: one
    step's gradients, step after step. Pass it as ``sum_of_squares(..., plan=plan)``.

    The layout (element counts, dtypes, device, chunks; on CUDA the chunk table in device memory) is
    built again when any of those changes (``builds``); the data pointers are compared on every call
    and, where gradients moved to new storage (most paths free and reallocate them each step), only
    the pointer table is updated (``pointer_updates``; on CUDA one small asynchronous copy). So a
    reallocated, resized or re-typed gradient never reads stale memory, and no call walks the
    tensors in Python. It holds no reference to a tensor. One per caller and set of tensors (two
    sets that alternate through one plan rebuild it every call: correct, not faster)."""

    def __init__(self):
        self._op_plan = None

    @property
    def builds(self) -> int:
        """How many times the op built the layout (0 until the op first runs with it)."""
        return self._op_plan.builds if self._op_plan is not None else 0

    @property
    def pointer_updates(self) -> int:
        """How many calls found the same layout at new data pointers."""
        return self._op_plan.pointer_updates if self._op_plan is not None else 0

    def run(self, op, tensors, per_tensor):
        """The op's results for ``tensors``, or None where they need the general path (several
        devices, a non-contiguous tensor, an unsupported dtype)."""
        if self._op_plan is None:
            self._op_plan = op.SumOfSquaresPlan()
        results = self._op_plan.run(tensors, per_tensor)
        return results if results else None


@functools.lru_cache(maxsize=None)
def load_op():
    """The compiled op, or None (with one warning) where it cannot be built or loaded."""
    from deepspeed.accelerator import get_accelerator
    try:
        builder = get_accelerator().create_op_builder("FusedNormBuilder")
        if builder is None or builder.name != "fused_norm":
            raise RuntimeError(f"accelerator '{get_accelerator().device_name()}' has no FusedNormBuilder")
        if not builder.is_compatible():
            raise RuntimeError(builder.error_log or "builder reports it is not compatible")
        return builder.load()
    except Exception as err:  # a missing compiler, an unsupported accelerator: the fallback is exact
        warnings.warn(f"deepspeed fused_norm op unavailable ({err}); grad norms use torch._foreach_norm "
                      "(same numbers, slower)")
        return None


def sum_of_squares(tensors: Iterable[torch.Tensor],
                   per_tensor: bool = False,
                   device=None,
                   implementation: str = "auto",
                   plan: Optional[SumOfSquaresPlan] = None) -> SumOfSquares:
    """Sum of squares over every element of ``tensors`` (any devices, any of fp32/fp16/bf16/fp64).

    Args:
        tensors: the tensors; empty ones count zero.
        per_tensor: also return each tensor's own sum of squares.
        device: where the results go (default: the first tensor's device, CPU for no tensors).
        implementation: "auto" (the op, else the torch fallback), "op" (raise if the op is
            unavailable) or "torch" (always the fallback).
        plan: a SumOfSquaresPlan to keep the op's plan in across calls on the same set (same
            numbers; no walk over the tensors in Python, and on CUDA no plan copied to the device).
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    tensors = list(tensors)
    op = None if implementation == "torch" else load_op()
    if op is None and implementation == "op":
        raise RuntimeError("deepspeed fused_norm op unavailable (see the warning from load_op())")
    planned = plan.run(op, tensors, per_tensor) if plan is not None and op is not None and tensors else None
    if planned is not None:
        total, nonfinite, per = planned
        if device is not None and total.device != torch.device(device):
            total, nonfinite, per = total.to(device), nonfinite.to(device), per.to(device)
        return SumOfSquares(total, nonfinite, per_tensor=per if per_tensor else None)
    groups = _by_device(tensors)
    device = torch.device(device) if device is not None else (tensors[0].device if tensors else torch.device("cpu"))

    sumsq = op.multi_tensor_sumsq if op is not None else _foreach_sumsq
    results = [sumsq([tensors[i] for i in indices], per_tensor) for indices in groups.values()]
    if len(results) == 1 and results[0][0].device == device:
        # The usual case, one device: no accumulation (this is called once per step, on the host's
        # critical path; every extra op is a launch).
        return SumOfSquares(*results[0][:2], per_tensor=results[0][2] if per_tensor else None)
    total = torch.zeros((), dtype=torch.float64, device=device)
    nonfinite = torch.zeros((), dtype=torch.bool, device=device)
    per = torch.zeros(len(tensors), dtype=torch.float64, device=device) if per_tensor else None
    for indices, (group_total, group_nonfinite, group_per) in zip(groups.values(), results):
        total += group_total.to(device)
        nonfinite |= group_nonfinite.to(device)
        if per_tensor:
            per[torch.tensor(indices, device=device)] = group_per.to(device)
    return SumOfSquares(total=total, nonfinite=nonfinite, per_tensor=per)


def l2_norm(tensors: Iterable[torch.Tensor], device=None, implementation: str = "auto") -> torch.Tensor:
    """The L2 norm of all elements of ``tensors`` together, as a 0-dim float64 tensor (inf/nan kept)."""
    return sum_of_squares(tensors, device=device, implementation=implementation).total.sqrt()


def _by_device(tensors):
    """Indices of ``tensors`` by device, in one pass that also checks every dtype."""
    groups = {}
    for index, tensor in enumerate(tensors):
        if tensor.dtype not in _DTYPES:
            raise TypeError(f"tensor {index} has dtype {tensor.dtype}; supported: {_DTYPES}")
        groups.setdefault(tensor.device, []).append(index)
    return groups


def _foreach_sumsq(tensors, per_tensor):
    """The fallback: torch._foreach_norm per dtype, accumulated in fp64 (in fp32 torch's CPU norm of a
    10M-element tensor is off by ~7e-4), squares combined in fp64."""
    device = tensors[0].device
    per = torch.zeros(len(tensors), dtype=torch.float64, device=device)
    by_dtype = {}
    for index, tensor in enumerate(tensors):
        by_dtype.setdefault(tensor.dtype, []).append(index)
    for indices in by_dtype.values():
        norms = torch._foreach_norm([tensors[i] for i in indices], 2, dtype=torch.float64)
        per[torch.tensor(indices, device=device)] = torch.stack(norms).square()
    total = per.sum()
    return total, ~torch.isfinite(total), per if per_tensor else None
