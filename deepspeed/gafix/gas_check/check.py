# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Run one config under several micro-batch x GAS splits and compare each with the fp64 reference."""

import copy
import math
from dataclasses import dataclass, field

import torch
from torch._utils import _unflatten_dense_tensors

import deepspeed
import deepspeed.comm as dist
from deepspeed.accelerator import get_accelerator
from deepspeed.runtime.constants import GRADIENT_CLIPPING_DEFAULT
from deepspeed.utils import safe_get_full_fp32_param

from .data import global_batches, loss_fn
from .diagnosis import explain_factor
from .models import builtin_layers, builtin_model
from .reference import reference_run

DEFAULT_SPLITS = ((16, 1), (8, 2), (4, 4), (2, 8))
# Relative errors allowed, by the dtype gradients are computed in. fp32: only the summation order
# differs from the reference (1e-7 seen). bf16 keeps 8 mantissa bits, fp16 11, and the gradients
# are rounded once per micro-batch before being accumulated (1e-2 seen).
TOLERANCE = {"fp32": 1e-5, "bf16": 2e-2, "fp16": 2e-2}
SEED = 1234


@dataclass
class SplitResult:
    micro: int
    gas: int
    world: int
    norm_error: float  # max over steps of |reported - reference| / reference; nan when not reported
    update_errors: list  # per step: ||update - reference update|| / ||reference update||
    update_factor: float  # least-squares factor, step-1 update vs reference
    norm_factor: float  # step-1 reported norm / reference norm
    rank_factors: list = field(default_factory=list)  # update_factor on each rank's own parameters
    tolerance: float = 0.0
    diagnosis: list = field(default_factory=list)

    @property
    def passed(self):
        norm_ok = math.isnan(self.norm_error) or self.norm_error <= self.tolerance
        return norm_ok and all(e <= self.tolerance for e in self.update_errors)

    @property
    def name(self):
        return f"{self.micro} x {self.gas} x {self.world}"


def config_dtype(config):
    if config.get("bf16", {}).get("enabled", False):
        return "bf16"
    if config.get("fp16", {}).get("enabled", False):
        return "fp16"
    return "fp32"


def config_loss_scale(config):
    fp16 = config.get("fp16", {})
    if not fp16.get("enabled", False):
        return None
    return fp16.get("loss_scale", 0) or 2.0**fp16.get("initial_scale_power", 16)


def split_config(config, micro, gas):
    config = copy.deepcopy(config)
    config.pop("train_batch_size", None)
    config["train_micro_batch_size_per_gpu"] = micro
    config["gradient_accumulation_steps"] = gas
    return config


def master_weights(engine):
    """fp32 master weights as fp64, by parameter name (ZeRO partitions gathered: a collective)."""
    # fp16 without ZeRO keeps fp32 copies beside the fp16 parameters: FP16_UnfusedOptimizer one per
    # parameter, FP16_Optimizer (fused optimizers) one flat buffer per group. The fp16 parameters
    # would round an update of lr 1e-3 to a few ulps.
    optimizer = engine.optimizer
    masters = {}
    for low, high in zip(getattr(optimizer, "fp16_groups", []), getattr(optimizer, "fp32_groups", [])):
        masters.update({id(p): q for p, q in zip(low, high)})
    for low, flat in zip(getattr(optimizer, "fp16_groups", []), getattr(optimizer, "fp32_groups_flat", [])):
        masters.update({id(p): q for p, q in zip(low, _unflatten_dense_tensors(flat, low))})
    weights = {}
    for name, param in engine.module.named_parameters():
        full = safe_get_full_fp32_param(param)
        if full is None:
            full = masters.get(id(param), param)
        weights[name] = full.detach().to("cpu", torch.float64).clone()
    return weights


def _seeded(make_model):
    """Build a model under the fixed seed: the engine's and the reference's start from the same weights."""
    torch.manual_seed(SEED)
    return make_model()


def train_split(config, make_model, batches, micro, gas, pipeline_stages, loop="step_every_micro_batch"):
    """Train with one split; return the reported norm per step and the weights before/after each step.

    ``loop``: "step_every_micro_batch" calls engine.backward() and engine.step() on every micro-batch
    (DeepSpeed's documented loop); "boundary" sets engine.set_gradient_accumulation_boundary() before
    each backward and calls step() once per global batch, as Hugging Face accelerate does; "step_once"
    calls backward() on every micro-batch and step() once, for ``managed_gradient_accumulation: false``.
    """
    if pipeline_stages:
        from deepspeed.pipe import PipelineModule
        model = _seeded(lambda: PipelineModule(layers=builtin_layers(), num_stages=pipeline_stages, loss_fn=loss_fn))
    else:
        model = _seeded(make_model)
    engine, *_ = deepspeed.initialize(model=model,
                                      model_parameters=[p for p in model.parameters() if p.requires_grad],
                                      config=split_config(config, micro, gas))
    dp_rank = engine.grid.get_data_parallel_id() if pipeline_stages else dist.get_rank()
    # gradient_allreduce_op "sum" adds the ranks' gradients: its callers normalize their loss over
    # the global batch, so the per-rank mean is divided by the number of data-parallel ranks.
    loss_divisor = dist.get_world_size() if config.get("gradient_allreduce_op", "mean") == "sum" else 1
    dtype = next(engine.module.parameters()).dtype
    device = get_accelerator().current_device_name()
    per_rank = micro * gas
    norms, weights = [], [master_weights(engine)]
    for inputs, targets in batches:
        x = inputs[dp_rank * per_rank:(dp_rank + 1) * per_rank].to(device, dtype)
        y = targets[dp_rank * per_rank:(dp_rank + 1) * per_rank].to(device)
        micro_batches = [(x[i * micro:(i + 1) * micro], y[i * micro:(i + 1) * micro]) for i in range(gas)]
        if pipeline_stages:
            engine.train_batch(data_iter=iter(micro_batches))
        else:
            for i, (xb, yb) in enumerate(micro_batches):
                last = i == gas - 1
                if loop == "boundary":
                    engine.set_gradient_accumulation_boundary(last)
                engine.backward(loss_fn(engine(xb), yb) / loss_divisor)
                if loop == "step_every_micro_batch" or last:
                    engine.step()
        norm = engine.get_global_grad_norm()
        norms.append(float("nan") if norm is None else float(norm))
        weights.append(master_weights(engine))
    engine.destroy()
    return norms, weights


def _update_sums(weights, reference, step):
    """<obs, ref>, <ref, ref>, |obs - ref|^2 of the update after ``step`` steps, over this rank's tensors."""
    dot = ref_sq = diff_sq = 0.0
    for name, final in weights[step].items():
        observed = final - weights[0][name]
        expected = reference[step][name] - reference[0][name]
        dot += (observed * expected).sum().item()
        ref_sq += (expected * expected).sum().item()
        diff_sq += ((observed - expected)**2).sum().item()
    return dot, ref_sq, diff_sq


def _all_reduce(values, op=dist.ReduceOp.SUM):
    tensor = torch.tensor(values, dtype=torch.float64, device=get_accelerator().current_device_name())
    dist.all_reduce(tensor, op=op)
    return tensor.cpu().tolist()


def compare_split(micro, gas, norms, weights, ref_norms, ref_weights, tolerance, loss_scale, clip):
    world = dist.get_world_size()
    steps = len(norms)
    # Every distinct tensor is held by the same number of ranks (all of them, or one stage's data-
    # parallel group), so sums over all ranks give the same ratios as sums over distinct tensors.
    local = [_update_sums(weights, ref_weights, step) for step in range(1, steps + 1)]
    sums = _all_reduce([s for step_sums in local for s in step_sums])
    update_errors = [math.sqrt(sums[3 * s + 2] / sums[3 * s + 1]) for s in range(steps)]
    update_factor = sums[0] / sums[1]
    dot, ref_sq, _ = local[0]
    own = [0.0] * world
    own[dist.get_rank()] = dot / ref_sq if ref_sq else float("nan")
    rank_factors = _all_reduce(own)
    norm_errors = [abs(n - r) / r for n, r in zip(norms, ref_norms)]
    result = SplitResult(micro=micro,
                         gas=gas,
                         world=world,
                         norm_error=max(norm_errors),
                         update_errors=update_errors,
                         update_factor=update_factor,
                         norm_factor=norms[0] / ref_norms[0],
                         rank_factors=rank_factors,
                         tolerance=tolerance)
    if not result.passed:
        result.diagnosis = diagnose(result, loss_scale, clip)
    return result


def diagnose(result, loss_scale, clip):
    lines = []
    norm_reading = explain_factor(result.norm_factor, result.gas, result.world, loss_scale)
    if norm_reading and not math.isnan(result.norm_factor):
        lines.append(f"reported grad norm {norm_reading}")
    update_reading = explain_factor(result.update_factor, result.gas, result.world, loss_scale)
    if update_reading:
        lines.append(f"update {update_reading}")
    spread = [f for f in result.rank_factors if not math.isnan(f)]
    if spread and max(spread) - min(spread) > 0.03 * max(abs(f) for f in spread):
        lines.append("update factor differs between ranks (per pipeline stage?): " +
                     ", ".join(f"rank {r} x{f:.4g}" for r, f in enumerate(result.rank_factors)))
        for rank, factor in enumerate(result.rank_factors):
            reading = explain_factor(factor, result.gas, result.world, loss_scale)
            if reading:
                lines.append(f"rank {rank}: update {reading}")
    if clip > 0 and update_reading and "no clean factor" in update_reading:
        lines.append(f"gradient clipping is active ({clip:g}): a non-clean factor points at the clip norm")
    if not lines:
        lines.append(f"errors above tolerance {result.tolerance:g} without a clear factor")
    return lines


def check_gas_invariance(config,
                         make_model=builtin_model,
                         splits=DEFAULT_SPLITS,
                         steps=3,
                         pipeline_stages=0,
                         loop="step_every_micro_batch"):
    """Train ``config`` under each per-rank ``(micro, gas)`` split; return one SplitResult per split.

    ``loop`` is the training loop's style (see ``train_split``); ignored with ``pipeline_stages``.

    Call on every rank of an initialized deepspeed.comm. Every split must cover the same per-rank
    batch (micro x gas), so that the global batch is the same.
    """
    if len({micro * gas for micro, gas in splits}) != 1:
        raise ValueError(f"splits {splits}: micro-batch x GAS must be the same for all, to keep the global batch")
    if pipeline_stages and dist.get_world_size() % pipeline_stages:
        raise ValueError(f"{pipeline_stages} pipeline stages do not divide {dist.get_world_size()} ranks")
    config = dict(config)
    config.setdefault("optimizer", {"type": "SGD", "params": {"lr": 0.1}})
    if config["optimizer"].get("type", "").lower() not in ("adam", "adamw"):
        config.setdefault("zero_allow_untested_optimizer", True)
    dtype = config_dtype(config)
    clip = config.get("gradient_clipping", GRADIENT_CLIPPING_DEFAULT)
    dp_world = dist.get_world_size() // (pipeline_stages or 1)
    micro, gas = splits[0]
    batches = global_batches(steps, micro * gas * dp_world)

    if pipeline_stages:
        make_reference = lambda: torch.nn.Sequential(*builtin_layers())  # noqa: E731
    else:
        make_reference = make_model
    ref_norms, ref_weights = reference_run(lambda: _seeded(make_reference), batches, config["optimizer"], clip)
    results = []
    for micro, gas in splits:
        norms, weights = train_split(config, make_model, batches, micro, gas, pipeline_stages, loop)
        results.append(
            compare_split(micro, gas, norms, weights, ref_norms, ref_weights, TOLERANCE[dtype],
                          config_loss_scale(config), clip))
    return results


def format_results(results, title):
    header = [
        "split (micro x GAS x ranks)", "norm error", "update error step 1", f"step {len(results[0].update_errors)}",
        "verdict"
    ]
    rows = [header]
    for r in results:
        norm = "not reported" if math.isnan(r.norm_error) else f"{r.norm_error:.1e}"
        rows.append(
            [r.name, norm, f"{r.update_errors[0]:.1e}", f"{r.update_errors[-1]:.1e}", "PASS" if r.passed else "FAIL"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [title] + [" | ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows]
    for r in results:
        lines += [f"  {r.name}: {line}" for line in r.diagnosis]
    return "\n".join(lines)
