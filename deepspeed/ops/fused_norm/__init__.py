# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Sum of squares (squared global L2 norm) of many tensors: one fused multi-tensor op call per device.

    from deepspeed.ops.fused_norm import sum_of_squares, l2_norm

    result = sum_of_squares(grads)          # any mix of fp32 / fp16 / bf16 / fp64 tensors
    result.total, result.nonfinite          # 0-dim fp64 and bool tensors, on the tensors' device
    l2_norm(grads)                          # sqrt(result.total)

The op (``FusedNormBuilder``, built by op_builder: JIT on first use, ``DS_BUILD_FUSED_NORM=1``
prebuilds) accumulates in fp32 within chunks of 64K elements and in fp64 across them, in a fixed
order, and flags inf/nan in the same pass; nothing is copied to the host. Where it cannot be built,
``torch._foreach_norm`` in fp64 gives the same numbers (slower), after one warning.

A set that recurs (a step's gradients) keeps the op's plan across calls::

    plan = SumOfSquaresPlan()               # one per caller and set
    sum_of_squares(grads, plan=plan)        # built on first use, again only when the set changes
"""

from .sum_of_squares import SumOfSquares, SumOfSquaresPlan, l2_norm, load_op, sum_of_squares

__all__ = ["SumOfSquares", "SumOfSquaresPlan", "l2_norm", "load_op", "sum_of_squares"]
