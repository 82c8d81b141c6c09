# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Run one config under several micro-batch x GAS splits and compare each with the fp64 reference
(or, for a model too large for an fp64 copy on every rank, with the same micro-batches trained without
accumulation). Each rank keeps only the weights it owns (ownership.py).

The data flows one way: a strategy per kind of comparison trains a split (training.py, which compares
nothing), gathers its sums over the ranks in one collective (comparison.py) and returns a complete result
(verdict.py); the diagnosis (diagnosis.py) and the notes are read off the finished results; formatting.py
prints them.
"""

import gc
from dataclasses import dataclass, replace

import torch

import deepspeed.comm as dist
from deepspeed.accelerator import get_accelerator
from deepspeed.runtime.constants import GRADIENT_CLIPPING_DEFAULT

from .accumulation import reading as bf16_accumulation_reading
from .batches import check_batches, item_mean
from .buckets import with_small_buckets
from .comparison import flat, gather, relative_errors, sums_as_trained, sums_between, update_sums
from .data import global_batches, item_batches, item_loss_sum, item_mean_loss, loss_fn as builtin_loss, sample_loss_sum
from .diagnosis import diagnose
from .formatting import format_results  # noqa: F401 (the check's printed form, where callers found it)
from .models import builtin_layers, builtin_model
from .options import DEFAULT_SPLITS, CheckOptions  # noqa: F401 (DEFAULT_SPLITS: where callers found it)
from .ownership import load_full
from .progress import quiet
from .reference import MasterStorage, reference_run
from .training import SplitTraining, _seeded, _trainable_count, per_item_mode
from .verdict import FLOOR_FACTOR, SplitResult, measured, raised_tolerance, tolerance  # noqa: F401

FLOOR_DTYPE = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# The fp64 reference holds the whole model on every rank: weights, gradients and up to two optimizer states in fp64,
# and an fp32 copy of the initial model while the engine trains (the weights it keeps per step are the rank's own
# elements only). Above REFERENCE_LIMIT_BYTES of that, the check runs without it ("auto").
REFERENCE_BYTES_PER_PARAMETER = 4 * 8 + 4
REFERENCE_LIMIT_BYTES = 2 * 2**30


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
    # The engine's model built under deepspeed.zero.Init (ZeRO-3's partitioned construction), the reference's not.
    zero_init: bool = False
    # The engine compiled (engine.compile(): torch.compile, DeepCompile with compile.deepcompile) before it trains,
    # as a training script that calls it; the reference runs eager.
    compiled: bool = False


@dataclass(frozen=True)
class Plan:
    """What every split of one check shares."""
    config: dict
    workload: Workload
    splits: tuple  # per-rank (micro-batch, GAS)
    loop: str
    progress: object
    dtype: str
    clip: float
    per_item: bool
    reference: bool  # compared with the fp64 reference
    grouped: bool  # without it, each split compared with its own micro-batches trained without accumulation
    small_buckets: str  # what --small-buckets set ("" without it)
    restart: object = None  # restart.Restart: this launch of ds_gas_check --restart saves, or resumes
    sequence: object = None  # sequence.SequenceParallel: Ulysses sequence parallelism

    def training(self, index, micro, gas, **kwargs):
        return SplitTraining(self.config,
                             self.workload,
                             micro,
                             gas,
                             self.loop,
                             self.progress,
                             index,
                             restart=self.restart,
                             sequence=self.sequence,
                             **kwargs)

    @property
    def data_world(self):
        """Ranks that hold different samples: not the pipeline's stages or a sequence's other chunks."""
        world = dist.get_world_size() // (self.workload.pipeline_stages or 1)
        return self.sequence.data_world(world) if self.sequence else world

    @property
    def resumed_at(self):
        """The step a resuming launch loads the checkpoint at (0: the splits train from the initial weights)."""
        return self.restart.step if self.restart is not None and self.restart.resume else 0


@dataclass(frozen=True)
class Kept:
    """A run kept for the splits after it: its weights at every step and what it reported."""
    weights: list
    norms: list
    losses: list


@dataclass(frozen=True)
class Check:
    """The results, one per split, and the notes on the whole check."""
    results: list
    notes: list


def _kept(stream, into):
    """``stream``, each item also appended to ``into``."""
    for item in stream:
        into.append(item)
        yield item


def _rank_factor(step_1_sums):
    """This rank's update factor on its own elements at step 1, in its slot of a list over the ranks."""
    dot, exp_sq = step_1_sums[0], step_1_sums[1]
    own = [0.0] * dist.get_world_size()
    own[dist.get_rank()] = dot / exp_sq if exp_sq else float("nan")
    return own


def _result(plan, micro, gas, trained, expected, totals, **fields):
    """A split's complete result: what it reported, what was expected, its gathered sums and ``fields``."""
    return measured(micro,
                    gas,
                    dist.get_world_size(),
                    trained.norms,
                    expected.norms,
                    totals["sums"],
                    totals["factors"],
                    losses=trained.losses,
                    expected_losses=expected.losses,
                    small_buckets=plan.small_buckets,
                    skipped_steps=trained.skipped_steps,
                    **fields)


def _without_reference(plan, micro, gas, trained, local, expected, tol, compared_with):
    """A split compared with a run of the same micro-batches (itself, the first split, or without accumulation)."""
    totals = gather(sums=flat(local), factors=_rank_factor(local[0]))
    return _result(plan,
                   micro,
                   gas,
                   trained,
                   expected,
                   totals,
                   tolerance=tol,
                   tolerance_for_dtype=tol,
                   compared_with=compared_with)


def split_by_itself(plan, index, micro, gas):
    """The first split without a reference: compared with itself; kept for the splits after it (unless each of
    those is compared with its own run without accumulation)."""
    training = plan.training(index, micro, gas)
    weights = []
    local = sums_as_trained(training.weights() if plan.grouped else _kept(training.weights(), weights), None)
    trained = training.trained()
    result = _without_reference(plan, micro, gas, trained, local, trained, tolerance(plan.dtype, gas), "itself")
    return result, None if plan.grouped else Kept(weights, trained.norms, trained.losses)


def split_against(plan, index, micro, gas, expected, tol, compared_with):
    """A split compared step by step, as it trains, with a kept run: only that run's weights are held. Both sides
    carry their own rounding: ``tol`` is the sum of theirs."""
    training = plan.training(index, micro, gas)
    local = sums_as_trained(training.weights(), expected.weights)
    return _without_reference(plan, micro, gas, training.trained(), local, expected, tol, compared_with)


def split_without_accumulation(plan, index, micro, gas):
    """A split compared with the same micro-batches trained without accumulation (padded tokens: each micro-batch's
    loss is its own mean, so the split changes the loss by design)."""
    training = plan.training(index, micro, gas, grouped=True)
    weights = list(training.weights())
    trained = training.trained()
    expected = Kept(weights, trained.norms, trained.losses)
    tol = tolerance(plan.dtype, gas) + tolerance(plan.dtype, 1)
    return split_against(plan, index, micro, gas, expected, tol, "the same micro-batches without accumulation")


def split_against_reference(plan, index, micro, gas, global_reference):
    """A split compared with the fp64 reference from the engine's own initial weights; also returns the reference
    on the whole global batch (trained once, at the first split). A resumed split (``plan.resumed_at``): the weights
    it loaded are compared with the reference's at that step, and the steps after it from there."""
    config, dtype = plan.config, plan.dtype
    training = plan.training(index, micro, gas, with_reference=True)
    weights = list(training.weights())
    trained = training.trained()
    run = reference_runs(plan, training, weights[0])
    dp_world = dist.get_world_size() // (plan.workload.pipeline_stages or 1)
    # per_item: the mean over every item of the global batch (the whole batch as one micro-batch);
    # mean mode: the mean of the split's micro-batch means, DeepSpeed's contract.
    parts, reference_loss = ((1, item_mean(training.reference_loss)) if plan.per_item else
                             (gas * plan.data_world, training.reference_loss))
    expected = run(parts, reference_loss)
    if plan.per_item:
        global_reference = expected  # the gap of mean mode does not apply
    elif global_reference is None:
        global_reference = run(1, training.reference_loss)
    # What rounding alone does to this model: plain PyTorch, same micro-batches, the engine's precision.
    floor = run(parts, reference_loss, FLOOR_DTYPE[dtype],
                get_accelerator().current_device_name(), config_loss_scale(config), **config_storage(config, dp_world))
    steps, at = len(trained.norms), plan.resumed_at
    totals = gathered_sums(plan, weights, steps, expected, floor, global_reference)
    restored_errors = relative_errors(totals["restored"]) if at else [float("nan")] * 2
    floor_norm_errors = [abs(n - r) / (r or 1.0) for n, r in zip(floor.norms, expected.norms)]
    noise_floor = max(floor_norm_errors + relative_errors(totals["floor_gaps"] + totals["floor_gaps_before"]))
    expected = Kept(expected.weights[at:], expected.norms[at:], expected.losses[at:])
    tol = tolerance(dtype, gas)
    result = _result(
        plan,
        micro,
        gas,
        trained,
        expected,
        totals,
        tolerance=raised_tolerance(tol, dtype, noise_floor),
        tolerance_for_dtype=tol,
        floor_update_errors=relative_errors(totals["floor"]),
        noise_floor=noise_floor,
        floor_factor=FLOOR_FACTOR[dtype],
        loss_normalization_gap=(float("nan") if plan.per_item else relative_errors(totals["global_gap"])[0]),
        first_step=at + 1,
        restored_error=restored_errors[0],
        restored_floor_error=restored_errors[1] if dtype != "fp32" else float("nan"))
    return result, global_reference


def reference_runs(plan, training, initial_weights):
    """``run(parts, loss, *precision, **storage)``: the reference trained on the split's workload from the engine's
    initial weights (this rank's ``initial_weights``, its spans of them), in fp64 unless ``precision`` says."""
    model = training.reference_model
    initial = {name: (start, initial_weights[name]) for name, (start, _) in training.spans.items()}
    source = f"--model ({type(model).__name__})"

    def from_initial():
        """The reference model in fp64 at the engine's initial weights (one model for every run: the
        previous run's gradients are dropped, and a low-precision run leaves it in fp32)."""
        model.zero_grad(set_to_none=True)
        load_full(model.double(), initial, source)
        return model

    def run(parts, loss, *precision, **storage):
        return reference_run(from_initial(),
                             plan.workload.batches,
                             parts,
                             plan.config["optimizer"],
                             plan.clip,
                             loss,
                             *precision,
                             owned_spans=training.spans,
                             scheduler_config=plan.config.get("scheduler"),
                             **storage)

    return run


def gathered_sums(plan, weights, steps, expected, floor, global_reference):
    """The split's sums against the references, over every rank (one collective): the engine's weights against the
    fp64 reference and the noise floor, the floor against the reference, the mean-mode gap, and what a resumed run
    restored."""
    at = plan.resumed_at
    # Resumed: weights[1] is what the engine loaded; each step after it is compared from there, so that a state
    # the load lost shows at the first step it moves, not diluted by the steps before the save.
    observed = weights[1:] if at else weights
    local = sums_between(observed, expected.weights[at:], steps)
    restored = flat(
        [update_sums(weights[1], weights[0], run.weights[at], run.weights[0])
         for run in (expected, floor)]) if at else []
    return gather(
        sums=flat(local),
        factors=_rank_factor(local[0]),
        floor=flat(sums_between(observed, floor.weights[at:], steps)) if plan.dtype != "fp32" else [],
        floor_gaps=flat(sums_between(floor.weights[at:], expected.weights[at:], steps)),
        # Resumed: the weights it loaded carry the rounding of the steps before the save; what rounding does there
        # counts in the noise floor, as it did for the run that saved them.
        floor_gaps_before=flat(sums_between(floor.weights, expected.weights, at)),
        global_gap=[] if plan.per_item else flat(sums_between(expected.weights, global_reference.weights, 1)),
        restored=restored)


# torch_autocast's "dtype" values (the engine's DtypeEnum spellings) by the precision they compute in.
AUTOCAST_DTYPES = {
    "bf16": ("bf16", "bfloat16", "torch.bfloat16"),
    "fp16": ("fp16", "float16", "half", "torch.float16"),
}


def config_dtype(config):
    """The precision the engine computes gradients in: the tolerance and the plain-PyTorch floor follow it."""
    if config.get("bf16", {}).get("enabled", False):
        return "bf16"
    if config.get("fp16", {}).get("enabled", False):
        return "fp16"
    autocast = config.get("torch_autocast") or {}
    if autocast.get("enabled", False):
        # fp32 weights, but the forward and backward of the lower-precision-safe modules run in the autocast dtype:
        # their rounding is that dtype's, not fp32's. Without "dtype", torch.autocast's default for the device.
        default = "bf16" if get_accelerator().device_name() == "cpu" else "fp16"
        spelled = str(autocast.get("dtype") or default)
        for dtype, spellings in AUTOCAST_DTYPES.items():
            if spelled in spellings:
                return dtype
    return "fp32"


def config_storage(config, dp_world):
    """How the engine stores master weights where a config keeps them in low precision
    (``bf16_master_weights_and_grads``, ``bf16_optimizer_states``, ``fp16_master_weights_and_grads``): the
    plain-PyTorch run in the engine's precision keeps them so too, so that its rounding is the engine's."""
    bf16, fp16 = config.get("bf16") or {}, config.get("fp16") or {}
    if bf16.get("enabled", False) and bf16.get("bf16_master_weights_and_grads", False):
        # DeepSpeedCPUAdam keeps its moments in bf16 with bf16_optimizer_states, or when told fp32_optimizer_states false.
        bf16_states = (bf16.get("bf16_optimizer_states", False)
                       or ((config.get("optimizer") or {}).get("params") or {}).get("fp32_optimizer_states") is False)
        dtype, states = torch.bfloat16, torch.bfloat16 if bf16_states else None
    elif fp16.get("enabled", False) and fp16.get("fp16_master_weights_and_grads", False):
        dtype, states = torch.float16, None
    else:
        return {}
    stage = int((config.get("zero_optimization") or {}).get("stage", 0))
    return dict(master_storage=MasterStorage(dtype, optimizer_steps_in_fp32(config), states, dp_world, stage >= 2))


def optimizer_steps_in_fp32(config):
    """Whether the engine's optimizer for this config computes in fp32 whatever its parameters' dtype: DeepSpeed's
    fused and CPU Adam (not ``torch_adam``), Lion, and CPU Adagrad (optimizer offload); the rest are torch's."""
    optimizer = config.get("optimizer") or {}
    kind, params = str(optimizer.get("type", "")).lower(), optimizer.get("params") or {}
    offload = str(((config.get("zero_optimization") or {}).get("offload_optimizer") or {}).get("device", "none"))
    if kind in ("adam", "adamw"):
        return not params.get("torch_adam", False)
    return kind == "lion" or (kind == "adagrad" and offload.lower() in ("cpu", "nvme"))


def config_loss_scale(config):
    fp16 = config.get("fp16", {})
    if not fp16.get("enabled", False):
        return None
    return fp16.get("loss_scale", 0) or 2.0**fp16.get("initial_scale_power", 16)


def make_workload(config, options):
    """The model factory, the global batches and the loss of a check; validates ``options``' data against its
    splits.

    ``items`` "variable": the built-in data with 0-12 labelled positions per sample (an item is one), its
    loss a sum over items with their count in per_item mode, each micro-batch's item mean in mean mode.
    ``sequence`` (sequence.SequenceParallel): the built-in self-attention model and its sequences."""
    make_model, data, loss_fn, items, sequence = (options.make_model, options.data, options.loss_fn, options.items,
                                                  options.sequence)
    splits, steps, pipeline_stages = options.splits, options.steps, options.pipeline_stages
    dp_world = dist.get_world_size() // (pipeline_stages or 1)
    if sequence:
        if make_model is not None or data is not None or items != "fixed":
            raise ValueError("--sequence-parallel checks the built-in self-attention model on its own sequences: "
                             "not with --model, --data or --items variable")
        dp_world = sequence.data_world(dp_world)
    micro, gas = splits[0]
    global_size = micro * gas * dp_world
    per_item = per_item_mode(config)
    if items == "variable" and data is not None:
        raise ValueError("--items variable checks the built-in data; with --data, your --loss decides the items "
                         "(with \"loss_normalization\": \"per_item\" it returns (loss_sum, num_items))")
    if items == "variable" and make_model not in (None, builtin_model):
        raise ValueError("--items variable trains the built-in model on its 12-position samples: not with --model")
    if data is None and items == "variable":
        batches = item_batches(steps, global_size)
        loss_fn = item_loss_sum if per_item else item_mean_loss
    elif data is None:
        batches = sequence.batches(steps, global_size) if sequence else global_batches(steps, global_size)
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
    if sequence:
        make_model = sequence.make_model
    return Workload(make_model or builtin_model, batches, loss_fn, pipeline_stages, data is None and items == "fixed")


def check_gas_invariance(config, make_model=None, *, progress=None, **options):
    """Train ``config`` under each per-rank ``(micro, gas)`` split; return one SplitResult per split (run_check's
    results). ``make_model`` and ``options``: the fields of ``CheckOptions`` (splits, steps, data, loss_fn, items,
    reference, loop, small_buckets, sequence, zero_init, compiled), the options by keyword. With ``"loss_normalization":
    "per_item"`` the loss returns ``(loss_sum, num_items)`` and every split is compared with the fp64 mean over every
    item of the global batch.

    Call on every rank of an initialized deepspeed.comm. Every split must cover the same per-rank
    batch (micro x gas), so that the global batch is the same.
    """
    return run_check(make_plan(config, CheckOptions(make_model, **options), progress)).results


def run_check(plan):
    """Every split of ``plan`` (make_plan), compared; the results and the notes on the whole check."""
    splits = plan.splits
    results, first, global_reference = [], None, None
    for index, (micro, gas) in enumerate(splits):
        if plan.reference:
            result, global_reference = split_against_reference(plan, index, micro, gas, global_reference)
        elif plan.grouped and gas > 1:
            result = split_without_accumulation(plan, index, micro, gas)
        elif first is not None:
            first_micro, first_gas = splits[0]
            result = split_against(plan, index, micro, gas, first,
                                   tolerance(plan.dtype, gas) + tolerance(plan.dtype, first_gas),
                                   f"split {first_micro} x {first_gas} x {dist.get_world_size()}")
        else:
            result, first = split_by_itself(plan, index, micro, gas)
        results.append(result)
        gc.collect()  # this split's weights, before the next split trains
    note, accumulation_cause = bf16_accumulation_reading(plan.config, results)
    diagnoses = diagnose(results, config_loss_scale(plan.config), plan.clip,
                         plan.sequence.size if plan.sequence else 1)
    results = [
        replace(result, diagnosis=lines + ([accumulation_cause] if accumulation_cause and not result.passed else []))
        for result, lines in zip(results, diagnoses)
    ]
    return Check(results, [note] if note else [])


def make_plan(config, options, progress=None, restart=None):
    """Validate the check's ``options`` (CheckOptions) against ``config`` and settle what its splits share.
    ``restart`` (restart.Restart): a launch of the restart check: the saving one trains the steps up to the save, the
    resuming one every step (it loads the rest)."""
    refusal = options.refusal(dist.get_world_size())
    if refusal:
        raise ValueError(refusal)
    config = dict(config)
    config.setdefault("optimizer", {"type": "SGD", "params": {"lr": 0.1}})
    if config["optimizer"].get("type", "").lower() not in ("adam", "adamw"):
        config.setdefault("zero_allow_untested_optimizer", True)
    workload = make_workload(config, options)
    if options.zero_init:
        stage = config.get("zero_optimization", {}).get("stage", 0)
        if stage != 3:
            raise ValueError(
                f"--zero-init builds the model under deepspeed.zero.Init, which partitions it for ZeRO-3: "
                f"the config's zero_optimization.stage is {stage}")
        workload = replace(workload, zero_init=True)
    if options.compiled or (config.get("compile") or {}).get("deepcompile"):
        # DeepCompile replaces the engine's gradient hooks only once the engine is compiled, as a training script with
        # this config compiles it: checked without, the config's own path would go untested.
        workload = replace(workload, compiled=True)
    bucket_note = ""
    if options.small_buckets:
        config, bucket_note = with_small_buckets(config, _seeded(workload.make_model))
    per_item = per_item_mode(config)
    reference = options.reference
    if reference == "auto":
        reference = _trainable_count(workload) * REFERENCE_BYTES_PER_PARAMETER <= REFERENCE_LIMIT_BYTES
    if restart is not None:
        if not reference:
            raise ValueError("--restart compares with the fp64 reference, and this model is too large for one on "
                             "every rank (--reference forces it)")
        if not restart.resume:
            workload = replace(workload, batches=workload.batches[:restart.step])
    # Without a reference, a split is compared with what it must give: the same micro-batches' mean loss without
    # accumulation. Where every micro-batch holds the same items (the built-in data) that is the first split, and
    # per_item losses must not depend on the split at all; otherwise (padded tokens: the loss is each
    # micro-batch's own mean) the split changes the loss by design, and each split gets its own run without GAS.
    grouped = not reference and not per_item and not workload.uniform_items
    return Plan(config, workload, tuple(options.splits), options.loop, progress or quiet(), config_dtype(config),
                config.get("gradient_clipping", GRADIENT_CLIPPING_DEFAULT), per_item, bool(reference), grouped,
                bucket_note, restart, options.sequence)
