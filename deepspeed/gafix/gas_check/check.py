# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Run one config under several micro-batch x GAS splits and compare each with the fp64 reference
(or, for a model too large for an fp64 copy on every rank, with the same micro-batches trained without
accumulation). Each rank keeps only the weights it owns (ownership.py)."""

import copy
import gc
import math
from dataclasses import dataclass, field

import torch

import deepspeed
import deepspeed.comm as dist
from deepspeed.accelerator import get_accelerator
from deepspeed.runtime.constants import GRADIENT_CLIPPING_DEFAULT
from deepspeed.utils import safe_get_full_fp32_param

from .accumulation import reading as bf16_accumulation_reading
from .buckets import with_small_buckets
from .batches import check_batches, item_mean, model_item_loss, model_loss, rows, to
from .data import global_batches, item_batches, item_loss_sum, item_mean_loss, loss_fn as builtin_loss, sample_loss_sum
from .diagnosis import MATCH, Observation, describe, explain, no_known_cause
from .models import builtin_layers, builtin_model
from .optimizers import copy_muon_tags, tag_muon_parameters
from .ownership import _low_to_master, check_coverage, load_full, owned_masters, spans, sum_over_ranks, values
from .progress import quiet
from .reference import reference_run

DEFAULT_SPLITS = ((16, 1), (8, 2), (4, 4), (2, 8))
# Relative errors allowed, by the dtype gradients are computed in. fp32: only the summation order
# differs from the reference (1e-7 seen). bf16 keeps 8 mantissa bits, fp16 11, and the gradients
# are rounded once per micro-batch before being accumulated (1e-2 seen up to GAS 8).
TOLERANCE = {"fp32": 1e-5, "bf16": 2e-2, "fp16": 2e-2}
MEASURED_UP_TO_GAS = 8
# Beyond those, a model can be ill-conditioned (attention biases whose gradient is pure rounding noise;
# Adam dividing by sqrt(v) + eps, which turns that noise into a full-size update): the check then
# also runs plain PyTorch in the engine's precision (fp32, or bf16/fp16 with fp32 master weights, on the
# engine's device) and allows FLOOR_FACTOR times the error that run has against the fp64 reference. In fp32 that error is
# noise amplified by the model, and two runs' noise differ (the engine's was 4x plain PyTorch's on a
# transformer with AdamW); in bf16/fp16 it is the rounding the engine does too (1.0-1.1x on a Llama).
FLOOR_FACTOR = {"fp32": 10, "bf16": 3, "fp16": 3}
# ... but never more than this: a dropped micro-batch at GAS 16 moves the update by 6%, so a looser
# check could not see it. A model whose rounding needs more is reported as such.
MAX_TOLERANCE = 5e-2
FLOOR_DTYPE = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
SEED = 1234
# The fp64 reference holds the whole model on every rank: weights, gradients and up to two optimizer states in fp64,
# and an fp32 copy of the initial model while the engine trains (the weights it keeps per step are the rank's own
# elements only). Above REFERENCE_LIMIT_BYTES of that, the check runs without it ("auto").
REFERENCE_BYTES_PER_PARAMETER = 4 * 8 + 4
REFERENCE_LIMIT_BYTES = 2 * 2**30


def tolerance(dtype, gas):
    """The relative error allowed for one split against the fp64 reference.

    Low-precision gradients are rounded once per micro-batch before they are added up, so the error
    grows with GAS like a random walk; the constants above were measured up to GAS 8.
    """
    base = TOLERANCE[dtype]
    if dtype == "fp32" or gas <= MEASURED_UP_TO_GAS:
        return base
    return base * math.sqrt(gas / MEASURED_UP_TO_GAS)


@dataclass
class SplitResult:
    micro: int
    gas: int
    world: int
    norm_error: float  # max over steps of |reported - expected| / expected; nan when not reported
    update_errors: list  # per step: ||update - expected update|| / ||expected update||
    update_factor: float  # least-squares factor, step-1 update vs expected
    norm_factor: float  # step-1 reported norm / expected norm
    rank_factors: list = field(default_factory=list)  # update_factor on each rank's own parameters
    tolerance: float = 0.0
    diagnosis: list = field(default_factory=list)
    compared_with: str = "fp64 reference"
    update_sums: list = field(default_factory=list)  # step 1: <obs, exp>, <exp, exp>, <obs, obs>, all ranks
    losses: list = field(default_factory=list)  # per step: mean micro-batch loss over every rank
    norms: list = field(default_factory=list)  # per step: the engine's get_global_grad_norm()
    expected_losses: list = field(default_factory=list)
    expected_norms: list = field(default_factory=list)
    # ||update of this split's reference - update of the global-batch reference|| / ||...|| at step 1:
    # what averaging per-micro-batch means changes with this data (nan without a reference).
    loss_normalization_gap: float = float("nan")
    # The largest error (norm or update, any step) of plain PyTorch in the engine's precision against
    # the fp64 reference (nan without a reference).
    noise_floor: float = float("nan")
    tolerance_for_dtype: float = 0.0  # the tolerance from the dtype (and GAS) alone
    floor_factor: float = 0.0  # the tolerance allows this many times the noise floor
    # Per step: ||update - update of that plain PyTorch run|| / ||that update|| (empty without a reference).
    floor_update_errors: list = field(default_factory=list)
    small_buckets: str = ""  # what --small-buckets set ("" without it)
    skipped_steps: int = 0  # steps the engine skipped (non-finite gradients)

    @property
    def steps_matching_floor(self):
        """Steps off the fp64 reference by more than the tolerance, but within the dtype's tolerance of plain
        PyTorch in the engine's precision on the same micro-batches: that precision's rounding, which Adam
        turns into a full-size step where a gradient is near zero (an element's sign flips), not the engine's."""
        return [
            step for step, (error, floor) in enumerate(zip(self.update_errors, self.floor_update_errors), 1)
            if error > self.tolerance and floor <= self.tolerance_for_dtype
        ]

    @property
    def updates_ok(self):
        matching = self.steps_matching_floor
        return all(e <= self.tolerance or step in matching for step, e in enumerate(self.update_errors, 1))

    @property
    def norm_ok(self):
        return math.isnan(self.norm_error) or self.norm_error <= self.tolerance

    @property
    def passed(self):
        return self.norm_ok and self.updates_ok

    @property
    def unresolved(self):
        """The norm agrees, and the update is off by more than MAX_TOLERANCE but by no more than this precision's
        rounding allows for this model (FLOOR_FACTOR x the noise floor): neither a pass nor a failure. Muon in
        bf16 does this: Newton-Schulz lifts the rounding in a gradient's small directions to full size."""
        allowed = self.floor_factor * self.noise_floor
        return (not self.passed and self.norm_ok and allowed > MAX_TOLERANCE
                and all(e <= allowed for e in self.update_errors))

    @property
    def verdict(self):
        return "PASS" if self.passed else "UNRESOLVED" if self.unresolved else "FAIL"

    @property
    def name(self):
        return f"{self.micro} x {self.gas} x {self.world}"


@dataclass
class Workload:
    """What is trained: a model factory, the global batches and the loss (None: the model returns it)."""
    make_model: object
    batches: list
    loss_fn: object = None
    pipeline_stages: int = 0
    # Every micro-batch holds the same number of items whatever the split (the built-in data): the splits'
    # expected updates are the same without a reference.
    uniform_items: bool = False


@dataclass
class SplitRun:
    norms: list
    losses: list
    weights: list  # {name: this rank's owned elements (ownership.py)}, before the first step and after each
    initial: dict  # {name: (start, tensor)}: the owned elements before the first step, for the reference
    reference_model: object  # an fp32 copy of the model for the reference, or None
    reference_loss: object
    spans: dict  # {name: (start, stop)}: which elements of each flattened parameter this rank owns
    step_sums: list = field(default_factory=list)  # per step, _update_sums against the run it was trained against
    skipped_steps: int = 0  # steps the engine skipped (non-finite gradients): their update is zero


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


def per_item_mode(config):
    return config.get("loss_normalization", "mean") == "per_item"


def split_config(config, micro, gas):
    config = copy.deepcopy(config)
    config.pop("train_batch_size", None)
    config["train_micro_batch_size_per_gpu"] = micro
    config["gradient_accumulation_steps"] = gas
    return config


def master_weights(engine, dtype=torch.float64):
    """Every fp32 master weight, whole, as ``dtype`` on the host, by parameter name (ZeRO partitions gathered: a
    collective per parameter). The check itself keeps only what each rank owns (ownership.py)."""
    masters = _low_to_master(engine.optimizer)
    weights = {}
    for name, param in engine.module.named_parameters():
        full = safe_get_full_fp32_param(param)
        if full is None:
            full = masters.get(id(param), param)
        weights[name] = full.detach().to("cpu", dtype).clone()
    return weights


def _seeded(make_model):
    """Build a model under the fixed seed: every rank and every split starts from the same weights."""
    torch.manual_seed(SEED)
    return make_model()


class LayerChain(torch.nn.Module):
    """A PipelineModule's layers in one process, named as the PipelineModule names them (the layer index)."""

    def __init__(self, layers):
        super().__init__()
        self.calls = []
        for index, layer in enumerate(layers):
            if hasattr(layer, "build"):  # LayerSpec
                if hasattr(layer, "key"):
                    raise ValueError("a PipelineModule with TiedLayerSpec: the checker's reference does not "
                                     "support tied layers")
                layer = layer.build()
            if isinstance(layer, torch.nn.Module):
                layer = copy.deepcopy(layer)
                self.add_module(str(index), layer)
            self.calls.append(layer)

    def forward(self, inputs):
        for call in self.calls:
            inputs = call(inputs)
        return inputs


def _pipeline_reference(module):
    """A plain-module twin of a PipelineModule and its loss function."""
    loss_fn = module.loss_fn
    if loss_fn is None:
        raise ValueError("the PipelineModule has no loss_fn: the pipeline engine needs one")
    return LayerChain(module._layer_specs), loss_fn


def _grouped_loss(loss_fn, micro, groups):
    """A pipeline's loss on ``groups`` x ``micro`` samples: the mean of its loss on each ``micro`` of them."""

    def part(value, k):
        if torch.is_tensor(value):
            return value[k * micro:(k + 1) * micro]
        return type(value)(part(v, k) for v in value)

    def loss(outputs, labels):
        return sum(loss_fn(part(outputs, k), part(labels, k)) for k in range(groups)) / groups

    return loss


def train_split(config, workload, micro, gas, loop, with_reference, progress, index, grouped=False, against=None):
    """Train with one split; return what it reported and this rank's owned weights before/after each step.

    ``loop``: "step_every_micro_batch" calls engine.backward() and engine.step() on every micro-batch
    (DeepSpeed's documented loop); "boundary" sets engine.set_gradient_accumulation_boundary() before
    each backward and calls step() once per global batch, as Hugging Face accelerate does; "step_once"
    calls backward() on every micro-batch and step() once, for ``managed_gradient_accumulation: false``.
    ``grouped``: what the split must give, without accumulation: one micro-batch of ``micro x gas`` samples per
    rank and step, whose loss is the mean of the losses of the split's ``gas`` micro-batches (the engine's
    contract under GAS, whatever the items per micro-batch).
    ``against``: the weights of the run this one is compared with (same spans): each step is compared as it is
    trained (``SplitRun.step_sums``) and no weights are kept, only the initial ones when they differ from its;
    "itself": the same with its own weights (a run that is its own comparison keeps only its initial weights).
    """
    stages = workload.pipeline_stages
    engine_micro, engine_gas = (micro * gas, 1) if grouped else (micro, gas)
    model = _seeded(workload.make_model)
    if config["optimizer"].get("type", "").lower() == "muon":
        tag_muon_parameters(model)
    trainable = _trainable(model, stages)
    if stages:
        reference_model, reference_loss = _pipeline_reference(model) if with_reference else (None, None)
    else:
        # A copy taken before the engine casts or partitions the model (ZeRO-3 empties its parameters).
        reference_model = copy.deepcopy(model) if with_reference else None
        if reference_model is not None:
            copy_muon_tags(model, reference_model)
        reference_loss = workload.loss_fn
    groups = gas if grouped else 1
    if grouped and stages:
        model.loss_fn = _grouped_loss(model.loss_fn, micro, groups)
    # The engine only: the optimizer and the rest it returns would outlive it in this frame.
    engine = deepspeed.initialize(model=model,
                                  model_parameters=[p for p in model.parameters() if p.requires_grad],
                                  config=split_config(config, engine_micro, engine_gas))[0]
    dp_rank = engine.grid.get_data_parallel_id() if stages else dist.get_rank()
    dp_world = dist.get_world_size() // (stages or 1)
    # gradient_allreduce_op "sum" adds the ranks' gradients: its callers normalize their loss over
    # the global batch, so the per-rank mean is divided by the number of data-parallel ranks (per_item
    # mode divides by the global item count itself).
    per_item = per_item_mode(config)
    loss_divisor = dist.get_world_size() if config.get("gradient_allreduce_op", "mean") == "sum" else 1
    item_sums, item_counts = [], []
    dtype = next(engine.module.parameters()).dtype
    device = get_accelerator().current_device_name()
    per_rank = micro * gas
    initial = owned_masters(engine, dp_rank, dp_world)
    owned_spans = spans(initial)
    check_coverage(owned_spans, trainable)
    norms, losses, weights, step_sums = [], [], [values(initial)], []
    if against is not None and against != "itself":
        if _all_equal(weights[0], against[0]):
            weights = [against[0]]  # the same seed and config start from the same weights: one copy of them
    what = f"split {micro} x {gas} x {dist.get_world_size()}" + (" without accumulation" if grouped else "")
    for step, batch in enumerate(workload.batches):
        local = rows(batch, dp_rank * per_rank, (dp_rank + 1) * per_rank)
        micro_batches = [
            to(rows(local, i * engine_micro, (i + 1) * engine_micro), device, dtype) for i in range(engine_gas)
        ]
        if stages:
            losses.append(float(engine.train_batch(data_iter=iter(micro_batches))))
        else:
            total, items = 0.0, 0.0
            for i, micro_batch in enumerate(micro_batches):
                last = i == engine_gas - 1
                if loop == "boundary":
                    engine.set_gradient_accumulation_boundary(last)
                if per_item:
                    loss, count = model_item_loss(engine, micro_batch, workload.loss_fn)
                    engine.backward(loss, num_items=count)
                    items += count.item()
                else:
                    # grouped: the mean of the split's micro-batch losses, one forward each, one backward
                    parts = [
                        model_loss(engine, rows(micro_batch, k * micro, (k + 1) * micro), workload.loss_fn)
                        for k in range(groups)
                    ] if grouped else [model_loss(engine, micro_batch, workload.loss_fn)]
                    loss = sum(parts) / len(parts)
                    engine.backward(loss / loss_divisor)
                total += loss.item()
                if loop == "step_every_micro_batch" or last:
                    engine.step()
            losses.append(total / engine_gas)
            item_sums.append(total)
            item_counts.append(items)
        norm = engine.get_global_grad_norm()
        norms.append(float("nan") if norm is None else float(norm))
        current = values(owned_masters(engine, dp_rank, dp_world))
        if against is None:
            weights.append(current)
        elif against == "itself":
            step_sums.append(_update_sums(current, weights[0], current, weights[0]))
        else:
            step_sums.append(_update_sums(current, weights[0], against[step + 1], against[0]))
        del current
        progress.step(index, what, step + 1, len(workload.batches))
    skipped_steps = engine.skipped_steps
    engine.destroy()
    del engine, model
    gc.collect()  # the engine's partitions and buffers, before the next split builds its own
    get_accelerator().empty_cache()
    if not stages and per_item:  # the sum of every rank's item losses over the global item count
        totals = sum_over_ranks(item_sums + item_counts)
        losses = [total / max(count, 1.0) for total, count in zip(totals[:len(losses)], totals[len(losses):])]
    elif not stages:  # the pipeline engine's loss is already the mean over its data-parallel ranks
        losses = [value / dist.get_world_size() for value in sum_over_ranks(losses)]
    return SplitRun(norms, losses, weights, initial, reference_model, reference_loss, owned_spans, step_sums,
                    skipped_steps)


def _trainable_count(workload):
    """The model's trainable parameters (all pipeline stages), built on the meta device where the factory allows."""
    try:
        with torch.device("meta"):
            model = _seeded(workload.make_model)
    except Exception:  # a factory that reads weights from disk, or a layer that needs data: build it for real
        model = _seeded(workload.make_model)
    return _trainable(model, workload.pipeline_stages)


def _trainable(model, stages):
    """Trainable parameters of the whole model: a pipeline stage's module holds its own layers only, and each of
    the stage's data-parallel ranks counts them (a collective with ``stages``)."""
    count = float(sum(p.numel() for p in model.parameters() if p.requires_grad))
    if stages:
        return sum_over_ranks([count])[0] / (dist.get_world_size() // stages)
    return count


def _gaps(run, other, steps):
    """Per step: ||update of run - update of other|| / ||update of other||, over every rank (one collective)."""
    return _relative_errors(_step_sums(run, other.weights, steps)[1], steps)


def _update_sums(final, start, expected_final, expected_start):
    """<obs, exp>, <exp, exp>, |obs - exp|^2, <obs, obs> of the update (final - start) against the expected one,
    over this rank's tensors."""
    dot = exp_sq = diff_sq = obs_sq = 0.0
    for name, value in final.items():
        observed = (value - start[name]).double()
        wanted = (expected_final[name] - expected_start[name]).double()
        dot += (observed * wanted).sum().item()
        exp_sq += (wanted * wanted).sum().item()
        diff_sq += ((observed - wanted)**2).sum().item()
        obs_sq += (observed * observed).sum().item()
    return dot, exp_sq, diff_sq, obs_sq


def _all_equal(ours, theirs):
    """Whether two runs' owned weights are identical on every rank (one collective)."""
    same = ours.keys() == theirs.keys() and all(torch.equal(ours[name], theirs[name]) for name in ours)
    return sum_over_ranks([0.0 if same else 1.0])[0] == 0.0


def _step_sums(run, weights, steps):
    """This rank's _update_sums of every step, and the same summed over every rank (one collective). ``weights``
    None: the sums ``run`` took as it trained (``train_split``'s ``against``).

    Every element is owned by one rank (ownership.py), so sums over all ranks are sums over the model."""
    local = run.step_sums if weights is None else [
        _update_sums(run.weights[step], run.weights[0], weights[step], weights[0]) for step in range(1, steps + 1)
    ]
    return local, sum_over_ranks([s for step_sums in local for s in step_sums])


def _relative_errors(sums, steps):
    """Per step: ||update of run - update of weights|| / ||update of weights||, from _step_sums' totals (where
    nothing was to move, any move is infinitely wrong: a zero expected update must not pass a moved one)."""
    return [
        math.sqrt(sums[4 * s + 2] / sums[4 * s + 1]) if sums[4 * s + 1] else (math.inf if sums[4 * s + 2] else 0.0)
        for s in range(steps)
    ]


def compare_split(micro, gas, run, expected_norms, expected_weights, tol, floor_weights=None):
    world = dist.get_world_size()
    steps = len(run.norms)
    local, sums = _step_sums(run, expected_weights, steps)
    update_errors = _relative_errors(sums, steps)
    dot, exp_sq, _, _ = local[0]
    own = [0.0] * world
    own[dist.get_rank()] = dot / exp_sq if exp_sq else float("nan")
    rank_factors = sum_over_ranks(own)
    norm_errors = [abs(n - r) / r if r else abs(n - r) for n, r in zip(run.norms, expected_norms)]
    floor_errors = [] if floor_weights is None else _relative_errors(_step_sums(run, floor_weights, steps)[1], steps)
    return SplitResult(micro=micro,
                       gas=gas,
                       world=world,
                       floor_update_errors=floor_errors,
                       norm_error=max(norm_errors),
                       update_errors=update_errors,
                       update_factor=sums[0] / sums[1] if sums[1] else float("nan"),
                       norm_factor=run.norms[0] / expected_norms[0] if expected_norms[0] else float("nan"),
                       rank_factors=rank_factors,
                       tolerance=tol,
                       update_sums=[sums[0], sums[1], sums[3]],
                       losses=run.losses,
                       norms=run.norms,
                       skipped_steps=run.skipped_steps)


def diagnose(results, loss_scale, clip):
    """Fill ``diagnosis`` of each failing split: a cause only when it explains every split (diagnosis.py)."""
    if all(r.passed for r in results):
        return
    tol = max(r.tolerance for r in results)
    updates = [Observation(r.gas, r.world, *r.update_sums) for r in results]
    update_causes = explain(updates, tol, loss_scale)
    norms_reported = not any(math.isnan(r.norm_factor) for r in results)
    norms = [Observation(r.gas, r.world, r.norm_factor, 1.0, r.norm_factor**2) for r in results]
    norm_causes = explain(norms, tol, loss_scale) if norms_reported else []
    update_wrong = not all(r.updates_ok for r in results)
    norm_wrong = norms_reported and any(r.norm_error > r.tolerance for r in results)
    norm_wrong_at_step_1 = norms_reported and any(abs(r.norm_factor - 1) > r.tolerance for r in results)
    for result, update, norm in zip(results, updates, norms):
        if result.passed or result.unresolved:
            continue
        lines = []
        if update_wrong:
            lines += [describe(cause, update, loss_scale) for cause in update_causes] or [no_known_cause(updates)]
        if norm_wrong and not norm_wrong_at_step_1:
            lines.append("reported grad norm: right at step 1; it differs later because the weights do"
                         if update_wrong else "reported grad norm: right at step 1, wrong after it")
        elif norm_wrong:
            factors = ", ".join(f"GAS {r.gas}: x{r.norm_factor:.4g}" for r in results)
            lines += [
                "reported grad norm: " + describe(cause, norm, loss_scale).replace("update x", "norm x")
                for cause in norm_causes
            ] or [f"reported grad norm: no known cause ({factors})"]
        spread = [f for f in result.rank_factors if not math.isnan(f)]
        if spread and max(spread) - min(spread) > 0.03 * max(abs(f) for f in spread):
            lines.append("update factor differs between ranks (per pipeline stage?): " +
                         ", ".join(f"rank {r} x{f:.4g}" for r, f in enumerate(result.rank_factors)))
        if clip > 0 and update_wrong and not update_causes:
            lines.append(clipping_reading(clip, [r.update_factor for r in results]))
        result.diagnosis = lines


def clipping_reading(clip, factors):
    """What an unexplained update factor says when gradient clipping is active."""
    text = f"gradient clipping is active ({clip:g}): it hides a scaled gradient's factor (check with gradient_clipping 0)"
    if all(f > 1 + MATCH for f in factors):
        return text + ("; updates larger than expected on every split mean a clip coefficient too large: the norm "
                       "it used may be smaller than the gradient's (a norm that misses part of the model: a pipeline "
                       "stage, experts, a rank's partition)")
    if all(f < 1 - MATCH for f in factors):
        return text + ("; updates smaller than expected on every split mean a clip coefficient too small: the norm "
                       "it used may be larger than the gradient's")
    return text


def make_workload(config, make_model, splits, steps, pipeline_stages, data, loss_fn, items="fixed"):
    """The model factory, the global batches and the loss of a check; validates data against splits.

    ``items`` "variable": the built-in data with 0-12 labelled positions per sample (an item is one), its
    loss a sum over items with their count in per_item mode, each micro-batch's item mean in mean mode."""
    dp_world = dist.get_world_size() // (pipeline_stages or 1)
    micro, gas = splits[0]
    global_size = micro * gas * dp_world
    per_item = per_item_mode(config)
    if items not in ("fixed", "variable"):
        raise ValueError(f"--items {items!r}: choose fixed or variable")
    if items == "variable" and data is not None:
        raise ValueError("--items variable checks the built-in data; with --data, your --loss decides the items "
                         "(with \"loss_normalization\": \"per_item\" it returns (loss_sum, num_items))")
    if items == "variable" and make_model not in (None, builtin_model):
        raise ValueError("--items variable trains the built-in model on its 12-position samples: not with --model")
    if data is None and items == "variable":
        batches = item_batches(steps, global_size)
        loss_fn = item_loss_sum if per_item else item_mean_loss
    elif data is None:
        batches = global_batches(steps, global_size)
        loss_fn = (sample_loss_sum if per_item else builtin_loss) if loss_fn is None else loss_fn
    else:
        batches = data(steps, global_size)
        size = check_batches(batches, "--data")
        if size != global_size:
            raise ValueError(f"--data gives global batches of {size} samples, but --splits {micro}x{gas} on "
                             f"{dp_world} data-parallel rank(s) needs {global_size}: change --splits (micro-batch x "
                             "GAS x ranks must equal the batch), or let the data factory take global_batch_size")
    if pipeline_stages:
        if make_model is None:
            from deepspeed.pipe import PipelineModule
            make_model = lambda: PipelineModule(  # noqa: E731
                layers=builtin_layers(), num_stages=pipeline_stages, loss_fn=loss_fn)
        if any(isinstance(batch, dict) for batch in batches):
            raise ValueError("the pipeline engine takes (inputs, labels) tuples, not dict batches")
    return Workload(make_model or builtin_model, batches, loss_fn, pipeline_stages, data is None and items == "fixed")


def check_gas_invariance(config,
                         make_model=None,
                         splits=DEFAULT_SPLITS,
                         steps=3,
                         pipeline_stages=0,
                         loop="step_every_micro_batch",
                         data=None,
                         loss_fn=None,
                         reference="auto",
                         progress=None,
                         items="fixed",
                         small_buckets=False):
    """Train ``config`` under each per-rank ``(micro, gas)`` split; return one SplitResult per split.

    ``make_model``: a no-argument factory (default: a small MLP; with ``pipeline_stages``, a
    PipelineModule factory, default the MLP in stages). ``data``: ``(steps, global_batch_size) ->
    batches`` (default: the MLP's); ``loss_fn``: ``(outputs, labels) -> loss``, None when the model
    returns its loss (the built-in data uses mean squared error). ``items``: "fixed" (the built-in data: a
    sample is an item) or "variable" (built-in samples of 0-12 labelled positions, see make_workload).
    With ``"loss_normalization": "per_item"`` the loss returns ``(loss_sum, num_items)`` and every split is
    compared with the fp64 mean over every item of the global batch. ``reference``: True (fp64 reference),
    False (each split compared with its own micro-batches trained without accumulation; with the built-in data or
    per_item losses, with the first split), "auto" (False when REFERENCE_BYTES_PER_PARAMETER per parameter exceed
    REFERENCE_LIMIT_BYTES). ``loop``: the training loop's style (see ``train_split``). ``small_buckets``: ZeRO's
    bucket, prefetch and sub-group sizes scaled to the model, so that it spans several (buckets.py).

    Call on every rank of an initialized deepspeed.comm. Every split must cover the same per-rank
    batch (micro x gas), so that the global batch is the same.
    """
    if len({micro * gas for micro, gas in splits}) != 1:
        raise ValueError(f"splits {splits}: micro-batch x GAS must be the same for all, to keep the global batch")
    if pipeline_stages and dist.get_world_size() % pipeline_stages:
        raise ValueError(f"{pipeline_stages} pipeline stages do not divide {dist.get_world_size()} ranks")
    progress = progress or quiet()
    config = dict(config)
    config.setdefault("optimizer", {"type": "SGD", "params": {"lr": 0.1}})
    if config["optimizer"].get("type", "").lower() not in ("adam", "adamw"):
        config.setdefault("zero_allow_untested_optimizer", True)
    dtype = config_dtype(config)
    clip = config.get("gradient_clipping", GRADIENT_CLIPPING_DEFAULT)
    workload = make_workload(config, make_model, splits, steps, pipeline_stages, data, loss_fn, items)
    bucket_note = ""
    if small_buckets:
        config, bucket_note = with_small_buckets(config, _seeded(workload.make_model))
    per_item = per_item_mode(config)
    dp_world = dist.get_world_size() // (pipeline_stages or 1)
    if reference == "auto":
        reference = _trainable_count(workload) * REFERENCE_BYTES_PER_PARAMETER <= REFERENCE_LIMIT_BYTES
    # Without a reference, a split is compared with what it must give: the same micro-batches' mean loss without
    # accumulation. Where every micro-batch holds the same items (the built-in data) that is the first split, and
    # per_item losses must not depend on the split at all; otherwise (padded tokens: the loss is each
    # micro-batch's own mean) the split changes the loss by design, and each split gets its own run without GAS.
    grouped = not reference and not per_item and not workload.uniform_items

    results, first, global_reference = [], None, None
    for index, (micro, gas) in enumerate(splits):
        tol = tolerance(dtype, gas)
        if not reference and (first is not None or (grouped and gas > 1)):
            # The run it is compared with first, then this split compared step by step as it trains: only one
            # run's weights are kept. Both sides carry their own rounding: the allowance is the sum of theirs.
            if grouped:
                expected = train_split(config, workload, micro, gas, loop, False, progress, index, grouped=True)
                tol += tolerance(dtype, 1)
                compared_with = "the same micro-batches without accumulation"
            else:
                expected = first
                tol += tolerance(dtype, splits[0][1])
                compared_with = f"split {splits[0][0]} x {splits[0][1]} x {dist.get_world_size()}"
            run = train_split(config, workload, micro, gas, loop, False, progress, index, against=expected.weights)
            result = compare_split(micro, gas, run, expected.norms, None, tol)
            result.compared_with = compared_with
            result.expected_losses, result.expected_norms = expected.losses, expected.norms
        elif reference:
            run = train_split(config, workload, micro, gas, loop, True, progress, index)
            source = f"--model ({type(run.reference_model).__name__})"
            model = run.reference_model

            def from_initial():
                """The reference model in fp64 at the engine's initial weights (one model for every run: the
                previous run's gradients are dropped, and a low-precision run leaves it in fp32)."""
                model.zero_grad(set_to_none=True)
                load_full(model.double(), run.initial, source)
                return model

            # per_item: the mean over every item of the global batch (the whole batch as one micro-batch);
            # mean mode: the mean of the split's micro-batch means, DeepSpeed's contract.
            parts, reference_loss = (1, item_mean(run.reference_loss)) if per_item else (gas * dp_world,
                                                                                         run.reference_loss)
            expected = reference_run(from_initial(),
                                     workload.batches,
                                     parts,
                                     config["optimizer"],
                                     clip,
                                     reference_loss,
                                     owned_spans=run.spans)
            if per_item:
                global_reference = expected  # the gap of mean mode does not apply
            if global_reference is None:
                global_reference = reference_run(from_initial(),
                                                 workload.batches,
                                                 1,
                                                 config["optimizer"],
                                                 clip,
                                                 run.reference_loss,
                                                 owned_spans=run.spans)
            # What rounding alone does to this model: plain PyTorch, same micro-batches, the engine's precision.
            floor = reference_run(from_initial(),
                                  workload.batches,
                                  parts,
                                  config["optimizer"],
                                  clip,
                                  reference_loss,
                                  FLOOR_DTYPE[dtype],
                                  get_accelerator().current_device_name(),
                                  config_loss_scale(config),
                                  owned_spans=run.spans)
            del model
            floor_norm_errors = [abs(n - r) / (r or 1.0) for n, r in zip(floor.norms, expected.norms)]
            noise_floor = max(floor_norm_errors + _gaps(floor, expected, len(expected.norms)))
            result = compare_split(micro,
                                   gas,
                                   run,
                                   expected.norms,
                                   expected.weights,
                                   max(tol, min(MAX_TOLERANCE, FLOOR_FACTOR[dtype] * noise_floor)),
                                   floor_weights=floor.weights if dtype != "fp32" else None)
            result.noise_floor, result.floor_factor = noise_floor, FLOOR_FACTOR[dtype]
            result.expected_losses, result.expected_norms = expected.losses, expected.norms
            result.loss_normalization_gap = float("nan") if per_item else _gaps(expected, global_reference, 1)[0]
        else:  # the first split, without a reference: compared with itself
            # Its weights are kept only where the splits after it are compared with it.
            run = train_split(config,
                              workload,
                              micro,
                              gas,
                              loop,
                              False,
                              progress,
                              index,
                              against="itself" if grouped else None)
            first = None if grouped else run
            result = compare_split(micro, gas, run, run.norms, None if grouped else run.weights, tol)
            result.compared_with = "itself"
            result.expected_losses, result.expected_norms = run.losses, run.norms
        result.tolerance_for_dtype = tol
        result.small_buckets = bucket_note
        results.append(result)
        run = expected = floor = None  # this split's weights, before the next split trains
        gc.collect()
    diagnose(results, config_loss_scale(config), clip)
    _, accumulation_cause = bf16_accumulation_reading(config, results)
    for result in results:
        if accumulation_cause and not result.passed:
            result.diagnosis.append(accumulation_cause)
    return results


def format_results(results, title):
    header = [
        "split (micro x GAS x ranks)", "norm error", "update error step 1", f"step {len(results[0].update_errors)}",
        "verdict"
    ]
    rows_ = [header]
    for r in results:
        norm = "not reported" if math.isnan(r.norm_error) else f"{r.norm_error:.1e}"
        rows_.append([r.name, norm, f"{r.update_errors[0]:.1e}", f"{r.update_errors[-1]:.1e}", r.verdict])
    widths = [max(len(row[i]) for row in rows_) for i in range(len(header))]
    lines = [title] + [" | ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows_]
    raised = [r for r in results if not math.isnan(r.noise_floor) and r.tolerance > r.tolerance_for_dtype]
    if raised:
        worst = max(raised, key=lambda r: r.noise_floor)
        lines.append(
            f"tolerance: {max(r.tolerance for r in raised):.1e}, {worst.floor_factor:g} x what rounding alone "
            f"gives this model in plain PyTorch (up to {worst.noise_floor:.1e}), above the dtype's "
            f"{worst.tolerance_for_dtype:.0e}")
        if worst.floor_factor * worst.noise_floor > MAX_TOLERANCE:
            lines.append(
                f"note: rounding alone moves this model's update by {worst.noise_floor:.1e} in this precision: "
                f"the tolerance stays at {MAX_TOLERANCE:.0e}, so a split failing by less may be rounding; a "
                "check in fp32 (or with --optimizer sgd) resolves finer errors")
    unresolved = [r for r in results if r.unresolved]
    if unresolved:
        lines.append(
            f"UNRESOLVED: {', '.join(r.name for r in unresolved)}: the grad norm agrees, but the update differs by "
            f"more than {MAX_TOLERANCE:.0e} and no more than this precision's rounding gives this model: a GAS error "
            "of that size cannot be told from rounding here; check the same config in fp32")
    for r in results:
        if r.steps_matching_floor:
            step = r.steps_matching_floor[0]
            lines.append(
                f"  {r.name}: update error {r.update_errors[step - 1]:.1e} at step {step} is over the tolerance "
                f"{r.tolerance:.1e}, but within {r.floor_update_errors[step - 1]:.1e} of plain PyTorch in this "
                "precision on the same device and micro-batches: the precision's rounding (Adam turns a "
                "near-zero gradient's rounding into a full-size step), not the engine")
    if results[0].small_buckets:
        lines.append(results[0].small_buckets)
    compared = {r.compared_with for r in results if r.compared_with != "itself"}
    if compared != {"fp64 reference"}:
        lines.append(f"compared with: {', '.join(sorted(compared))} (no fp64 reference: the model is too large for "
                     "one on every rank, or --no-reference; errors the same at every split are not seen this way: "
                     "docs/guides/gas_check.md)")
    for r in results:
        lines += [f"  {r.name}: {line}" for line in r.diagnosis]
        if r.skipped_steps:
            lines.append(f"  {r.name}: the engine skipped {r.skipped_steps} of {len(r.norms)} step(s) for non-finite "
                         "gradients (inf/nan): those steps did not update the weights")
    gaps = [r for r in results if r.loss_normalization_gap > r.tolerance]
    if gaps:
        lines.append("note: the loss is a mean over each micro-batch's own items and their counts vary, so the split "
                     "changes the loss itself: each split's expected update differs from the global-batch mean's by " +
                     ", ".join(f"{r.loss_normalization_gap:.1e} ({r.name})" for r in gaps) +
                     ". DeepSpeed averages micro-batch means by design and the check expects that; if the split must "
                     "not matter, set \"loss_normalization\": \"per_item\" and pass each micro-batch's loss sum "
                     "with engine.backward(loss_sum, num_items=n) (docs/guides/per_item_loss.md).")
    return "\n".join(lines)
