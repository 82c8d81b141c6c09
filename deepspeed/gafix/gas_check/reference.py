# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The fp64 reference: plain PyTorch, one process, the whole global batch per step."""

import torch

from .data import loss_fn


def reference_optimizer(params, optimizer_config):
    """The torch.optim twin of the config's ``optimizer`` section (SGD, Adam, AdamW)."""
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
    raise ValueError(f"config key 'optimizer.type' is '{kind}': the fp64 reference knows SGD, Adam and AdamW "
                     f"(pass --optimizer sgd or adamw to check with one of those)")


def global_norm(parameters):
    return torch.linalg.vector_norm(torch.stack([p.grad.detach().norm() for p in parameters if p.grad is not None]))


def named_weights(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def reference_run(make_model, batches, optimizer_config, clip):
    """Train ``batches`` in fp64; return the grad norm of each step and the weights before and after each."""
    model = make_model().double()
    optimizer = reference_optimizer(model.parameters(), optimizer_config)
    norms, weights = [], [named_weights(model)]
    for inputs, targets in batches:
        optimizer.zero_grad()
        loss_fn(model(inputs.double()), targets.double()).double().backward()
        norm = global_norm(model.parameters()).item()
        if clip > 0:
            # DeepSpeed's rule, as torch.nn.utils.clip_grad_norm_: scale when the norm exceeds clip.
            coef = clip / (norm + 1e-6)
            if coef < 1:
                for p in model.parameters():
                    p.grad.mul_(coef)
        optimizer.step()
        norms.append(norm)
        weights.append(named_weights(model))
    return norms, weights
