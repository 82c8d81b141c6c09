# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Rank worker: three clipped optimizer steps of each optimizer DeepSpeed's config names, on each ZeRO
stage (and CPU offload where the optimizer has a CPU op), against the same steps in fp64 PyTorch.

The reference trains the whole global batch of each step in fp64, clips with
``torch.nn.utils.clip_grad_norm_`` and steps torch's own optimizer (SGD, Adam, AdamW, Adagrad, Muon with
AdamW for the non-matrix parameters, as DeepSpeed's Muon splits them), or the rule written out (Lion from
its paper, LAMB as DeepSpeed's FusedLamb computes it). A case reports, per micro-batch x GAS split: the worst relative error of the weights' total change
over the three steps, the engine's global grad norm of each step next to the reference's (the gradient's,
before clipping), the reference's clip coefficients (below 1: the clip was active) and the reducing
collectives of each boundary ``step()``.
"""

import copy

import torch  # noqa: E402

import deepspeed  # noqa: E402
import deepspeed.comm as dist  # noqa: E402
from toolkit.collectives import CollectiveCounter  # noqa: E402
from helpers.master_weights import zero_master_weights  # noqa: E402
from helpers.rank_cases import run_cases  # noqa: E402
from helpers.small_model import global_batch, make_layers, micro_batches, mse, rank_share  # noqa: E402

STEPS = 3
SPLITS = [(8, 1), (2, 4)]
CLIP = 0.5  # below every step's gradient norm of the small model (about 2 to 4): the clip is active
# Muon's hyper-parameters: one lr for both halves keeps the config DeepSpeed's and torch's alike.
MUON = dict(lr=0.02, momentum=0.95, weight_decay=0.01, betas=(0.9, 0.95), eps=1e-10)


def lion_step(params, state, lr, betas, weight_decay):
    """Lion (Chen et al. 2023, Algorithm 2), in the dtype of ``params``."""
    beta1, beta2 = betas
    for p in params:
        m = state.setdefault(p, torch.zeros_like(p))
        update = (beta1 * m + (1 - beta1) * p.grad).sign()
        p.data.mul_(1 - lr * weight_decay).add_(update, alpha=-lr)
        m.mul_(beta2).add_(p.grad, alpha=1 - beta2)


def lamb_step(params, state, step, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, max_coeff=10.0, min_coeff=0.01):
    """LAMB as DeepSpeed's FusedLamb computes it (csrc/lamb/fused_lamb_cuda_kernel.cu), per tensor: Adam's moments,
    eps outside the square root of the uncorrected second moment, bias correction in the step size, decoupled
    weight decay inside the update, and the trust ratio ||p|| / ||update|| clamped to [min_coeff, max_coeff]."""
    beta1, beta2 = betas
    step_size = lr * (1 - beta2**step)**0.5 / (1 - beta1**step)
    for p in params:
        m, v = state.setdefault(p, (torch.zeros_like(p), torch.zeros_like(p)))
        m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
        update = m / (v.sqrt() + eps) + weight_decay * p.data
        w_norm, u_norm = p.data.norm().item(), update.norm().item()
        coeff = min(max(w_norm / u_norm, min_coeff), max_coeff) if w_norm and u_norm else 1.0
        p.data.add_(update, alpha=-step_size * coeff)


def newton_schulz_fp64(grad, ns_coefficients, ns_steps, eps):
    """torch.optim.Muon's orthogonalization, in fp64 instead of bf16 (the reference's precision)."""
    a, b, c = ns_coefficients
    x = grad.double()
    if grad.size(0) > grad.size(1):
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(ns_steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if grad.size(0) > grad.size(1) else x


class Reference:
    """The fp64 model and the optimizer(s) a plain PyTorch user would step."""

    def __init__(self, layers, kind, params):
        self.model = torch.nn.Sequential(*copy.deepcopy(layers)).double()
        self.kind, self.params, self.lion_state, self.lamb_state, self.steps = kind, params, {}, {}, 0
        weights = list(self.model.parameters())
        if kind == "Muon":
            import torch.optim._muon as torch_muon
            torch_muon._zeropower_via_newtonschulz = newton_schulz_fp64
            matrices = [p for p in weights if p.ndim >= 2]
            others = [p for p in weights if p.ndim < 2]
            self.optimizers = [
                torch.optim.Muon(matrices,
                                 lr=MUON["lr"],
                                 momentum=MUON["momentum"],
                                 weight_decay=MUON["weight_decay"],
                                 nesterov=True,
                                 adjust_lr_fn="original"),
                torch.optim.AdamW(others,
                                  lr=MUON["lr"],
                                  betas=MUON["betas"],
                                  eps=MUON["eps"],
                                  weight_decay=MUON["weight_decay"])
            ]
        elif kind in ("Lion", "Lamb"):
            self.optimizers = []
        else:
            self.optimizers = [getattr(torch.optim, kind)(weights, **params)]

    def step(self, inputs, targets, clip):
        weights = list(self.model.parameters())
        for p in weights:
            p.grad = None
        torch.nn.functional.mse_loss(self.model(inputs.double()), targets.double()).backward()
        norm = torch.nn.utils.clip_grad_norm_(weights, clip) if clip > 0 else torch.linalg.vector_norm(
            torch.stack([p.grad.norm() for p in weights]))
        coef = min(1.0, clip / (norm.item() + 1e-6)) if clip > 0 else 1.0
        self.steps += 1
        if self.kind == "Lion":
            lion_step(weights, self.lion_state, self.params["lr"], self.params["betas"], self.params["weight_decay"])
        if self.kind == "Lamb":
            lamb_step(weights, self.lamb_state, self.steps, **self.params)
        for optimizer in self.optimizers:
            optimizer.step()
        return norm.item(), coef

    def weights(self):
        return [p.detach().clone() for p in self.model.parameters()]


def engine_config(kind, params, micro, gas, stage, offload, dtype, clip):
    optimizer = {"type": kind, "params": dict(params)}
    config = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": gas,
        "optimizer": optimizer,
        "gradient_clipping": clip,
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {
            "stage": stage
        },
    }
    if kind == "Muon":
        # Newton-Schulz needs each matrix's whole reduced gradient: ZeRO refuses Muon with reduce-scatter.
        config["zero_optimization"]["reduce_scatter"] = False
    if offload:
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    if dtype == "bf16":
        config["bf16"] = {"enabled": True}
    if dtype == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 8}
    return config


def train(kind, params, micro, gas, stage, offload, dtype, clip):
    layers = make_layers()
    model = torch.nn.Sequential(*copy.deepcopy(layers))
    if kind == "Muon":
        for p in model.parameters():
            p.use_muon = p.ndim >= 2
    ds_params = dict(params)
    if kind == "Muon":
        ds_params = dict(lr=MUON["lr"],
                         momentum=MUON["momentum"],
                         weight_decay=MUON["weight_decay"],
                         betas=list(MUON["betas"]),
                         eps=MUON["eps"])
    config = engine_config(kind, ds_params, micro, gas, stage, offload, dtype, clip)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    reference = Reference(layers, kind, params)
    ranks, rank = dist.get_world_size(), dist.get_rank()
    before = list(zero_master_weights(engine).values())
    input_dtype = next(engine.module.parameters()).dtype
    norms, reference_norms, coefs, collectives = [], [], [], []
    for step in range(STEPS):
        inputs, targets = global_batch(micro * gas * ranks, seed=4321 + step)
        x, y = rank_share(inputs, targets, rank, micro * gas)
        for batch, target in micro_batches(x, y, micro, gas, input_dtype):
            engine.backward(mse(engine(batch.to(engine.device)), target.to(engine.device)))
            with CollectiveCounter() as counter:
                engine.step()
        collectives.append(len(counter.calls))
        norm = engine.get_global_grad_norm()
        norms.append(None if norm is None else float(norm))
        reference_norm, coef = reference.step(inputs, targets, clip)
        reference_norms.append(reference_norm)
        coefs.append(coef)
    after = list(zero_master_weights(engine).values())
    engine.destroy()
    expected = [w - w0 for w, w0 in zip(reference.weights(), [p.detach().double() for p in layers_params(layers)])]
    observed = [w - w0 for w, w0 in zip(after, before)]
    scale = max(e.abs().max().item() for e in expected)
    error = max((o - e).abs().max().item() for o, e in zip(observed, expected)) / scale
    return {
        "max_rel_error": error,
        "norms": norms,
        "reference_norms": reference_norms,
        "clip_coefficients": coefs,
        "collectives_in_boundary_step": collectives,
    }


def layers_params(layers):
    return [p for layer in layers for p in layer.parameters()]


def case(kind, params, stage, offload=False, dtype="fp32", clip=CLIP):

    def run():
        from deepspeed.accelerator import get_accelerator
        from deepspeed.runtime.zero.muon.original_muon import ns_compute_dtype
        accelerator = get_accelerator()
        fp16_supported = accelerator.is_fp16_supported
        if dtype == "fp16":
            # The CPU accelerator refuses fp16; the engine's fp16 paths are device-independent. Only for fp16
            # cases: it also makes Muon's Newton-Schulz run in fp16, as on a GPU.
            accelerator.is_fp16_supported = lambda: True
        newton_schulz = str(ns_compute_dtype("gram")).replace("torch.", "")
        try:
            results = {
                f"{micro}x{gas}": train(kind, params, micro, gas, stage, offload, dtype, clip)
                for micro, gas in SPLITS
            }
        finally:
            accelerator.is_fp16_supported = fp16_supported
        if kind == "Muon":
            for result in results.values():
                result["newton_schulz_dtype"] = newton_schulz
        return results

    return run


# The optimizers of DeepSpeed's config (`optimizer.type`) and the parameters each trains with here.
OPTIMIZERS = {
    "SGD": dict(lr=0.1, momentum=0.9),
    "Adam": dict(lr=0.01),
    "AdamW": dict(lr=0.01, weight_decay=0.01),
    "Adagrad": dict(lr=0.05),
    "Lion": dict(lr=0.001, betas=(0.9, 0.99), weight_decay=0.01),
    "Lamb": dict(lr=0.01, weight_decay=0.01),
    "Muon": {},
}
# Which have a CPU op, so run with ZeRO-Offload (the others refuse it or fall back to a torch optimizer).
OFFLOADABLE = {"Adam", "AdamW", "Adagrad", "Lion", "Muon"}


def table_cases():
    cases = {}
    for kind, params in OPTIMIZERS.items():
        for stage in (0, 1, 2, 3):
            cases[f"{kind}_zero{stage}_fp32"] = case(kind, params, stage)
            if kind in OFFLOADABLE and stage > 0:
                cases[f"{kind}_zero{stage}_offload_fp32"] = case(kind, params, stage, offload=True)
    for stage in (0, 1, 2, 3):
        for dtype in ("bf16", "fp16"):
            cases[f"Muon_zero{stage}_{dtype}"] = case("Muon", {}, stage, dtype=dtype)
        for dtype in ("fp32", "bf16"):
            cases[f"Muon_zero{stage}_{dtype}_noclip"] = case("Muon", {}, stage, dtype=dtype, clip=0.0)
    return cases


CASES = table_cases()

if __name__ == "__main__":
    run_cases(CASES)
