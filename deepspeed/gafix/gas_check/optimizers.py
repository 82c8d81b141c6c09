# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The reference's twins of DeepSpeed's optimizers that torch.optim lacks or computes in low precision: Lion,
written out from its paper, and Muon, torch.optim.Muon's rule plus AdamW for the parameters Muon leaves out, as
DeepSpeed's Muon splits them. Newton-Schulz runs in fp64 for the fp64 reference (torch runs it in bf16); for the
run in the engine's precision, in the dtype DeepSpeed runs it in (fp16 where the accelerator has it), whose
rounding is then part of what the check allows."""

import torch

# Newton-Schulz as DeepSpeed and torch.optim.Muon run it: quintic coefficients, steps, normalization epsilon.
NS_COEFFICIENTS, NS_STEPS, NS_EPS = (3.4445, -4.7750, 2.0315), 5, 1e-7


def is_muon_parameter(param):
    """DeepSpeed's Muon orthogonalizes the parameters tagged ``use_muon``; untagged, the matrices (by the layer's
    shape: a parameter built under zero.Init holds a 1-D partition)."""
    return getattr(param, "use_muon", len(getattr(param, "ds_shape", param.shape)) >= 2)


def tag_muon_parameters(model):
    """Tag every parameter of ``model`` the way is_muon_parameter reads it (DeepSpeed's Muon needs every
    parameter tagged); a tag the model set itself stays."""
    for param in model.parameters():
        param.use_muon = is_muon_parameter(param)


def copy_muon_tags(source, target):
    """``target``'s parameters take ``source``'s use_muon tags, by name (a deepcopy drops them)."""
    tags = {name: is_muon_parameter(p) for name, p in source.named_parameters()}
    for name, param in target.named_parameters():
        if name in tags:
            param.use_muon = tags[name]


class Lion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", Algorithm 2), as DeepSpeed's
    FusedLion and DeepSpeedCPULion define it: decoupled weight decay, sign of the interpolated momentum."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                momentum = self.state[p].setdefault("exp_avg", torch.zeros_like(p))
                update = (momentum * beta1 + p.grad * (1 - beta1)).sign_()
                p.mul_(1 - group["lr"] * group["weight_decay"]).add_(update, alpha=-group["lr"])
                momentum.mul_(beta2).add_(p.grad, alpha=1 - beta2)


def newton_schulz_dtype(param_dtype, ns_method):
    """fp64 for the fp64 reference; else the dtype DeepSpeed's Muon runs Newton-Schulz in."""
    if param_dtype == torch.float64:
        return torch.float64
    from deepspeed.runtime.zero.muon.original_muon import ns_compute_dtype
    return ns_compute_dtype(ns_method)


def orthogonalize(matrix, dtype):
    """Newton-Schulz's approximate orthogonalization of a 2-D ``matrix``, computed in ``dtype``."""
    a, b, c = NS_COEFFICIENTS
    x = matrix.T if matrix.size(0) > matrix.size(1) else matrix
    x = (x / x.norm().clamp(min=NS_EPS)).to(dtype)
    for _ in range(NS_STEPS):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    x = x.to(matrix.dtype)
    return x.T if matrix.size(0) > matrix.size(1) else x


class MuonWithAdamW(torch.optim.Optimizer):
    """torch.optim.Muon (nesterov, adjust_lr_fn "original") on the Muon parameters and AdamW on the others,
    with DeepSpeed Muon's defaults: momentum 0.95; AdamW betas (0.9, 0.95), eps 1e-10; one weight decay."""

    def __init__(self,
                 params,
                 lr=0.02,
                 momentum=0.95,
                 weight_decay=0.0,
                 betas=(0.9, 0.95),
                 eps=1e-10,
                 muon_lr=None,
                 adam_lr=None,
                 ns_method="gram"):
        params = list(params)
        super().__init__(params, dict(weight_decay=weight_decay))
        self.muon = [p for p in params if is_muon_parameter(p)]
        self.adamw = torch.optim.AdamW([p for p in params if not is_muon_parameter(p)] or [torch.zeros(0)],
                                       lr=adam_lr or lr,
                                       betas=tuple(betas),
                                       eps=eps,
                                       weight_decay=weight_decay)
        self.lr, self.beta, self.weight_decay, self.ns_method = muon_lr or lr, momentum, weight_decay, ns_method

    @torch.no_grad()
    def step(self):
        for p in self.muon:
            if p.grad is None:
                continue
            momentum = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
            momentum.lerp_(p.grad, 1 - self.beta)
            update = orthogonalize(
                p.grad.lerp(momentum, self.beta).reshape(len(p), -1), newton_schulz_dtype(p.dtype, self.ns_method))
            rows, cols = update.shape
            p.mul_(1 - self.lr * self.weight_decay)
            p.add_(update.reshape(p.shape), alpha=-self.lr * max(1.0, rows / cols)**0.5)
        self.adamw.step()

    def zero_grad(self, set_to_none=True):
        super().zero_grad(set_to_none)
        self.adamw.zero_grad(set_to_none)
