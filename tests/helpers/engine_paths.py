# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""What the norm workers share: the precision settings of their engine paths, the paths the MoE workers train
(one per optimizer a norm goes through, ZeRO-3 aside), and how far an update is from the fp64 one."""

import torch

FP16 = {"fp16": {"enabled": True, "initial_scale_power": 8}}
BF16 = {"bf16": {"enabled": True}}
# path -> (config, ZeRO stage)
ZERO_PATHS = {
    "zero0_fp32": ({}, 0),
    "zero0_fp16": (FP16, 0),  # FP16_UnfusedOptimizer
    "zero1_fp32": ({}, 1),
    "zero2_fp32": ({}, 2),
    "zero1_bf16_fp32_accumulation": (dict(BF16, data_types={"grad_accum_dtype": "fp32"}), 1),  # BF16_Optimizer
    "zero2_bf16": (BF16, 2),
}


def relative_update_error(after, expected, before):
    """How far the weights ``after`` the step are from the ``expected`` ones, relative to the expected update
    from ``before`` (three lists of tensors, in one order): 0 is the fp64 update exactly."""
    gap = torch.cat([(a - e).flatten() for a, e in zip(after, expected)])
    step = torch.cat([(e - b).flatten() for e, b in zip(expected, before)])
    return float(gap.norm() / step.norm())


def reference_sgd_step(parameters, lr, clip):
    """One step of the fp64 reference on ``parameters``' gradients: SGD clipped as DeepSpeed clips (the coefficient
    clip / (norm + 1e-6), at most 1), in place. Returns the gradients' global norm."""
    parameters = list(parameters)
    norm = float(torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in parameters])))
    coef = min(1.0, clip / (norm + 1e-6))
    with torch.no_grad():
        for param in parameters:
            param -= lr * coef * param.grad
    return norm
