# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""ds_gas_check: check a DeepSpeed config for gradient-accumulation invariance before a long run.

Trains one global batch (and a few steps) under several micro-batch x GAS splits and compares each
with a plain fp64 PyTorch run from the same weights: the engine's reported global grad norm and
the fp32 master-weight update after the first and the last step. Exit status 0 only when every
split passes; 1 when one fails (with a diagnosis); 3 when none fails but one is UNRESOLVED (the
precision's rounding hides what a check could see: check it in fp32); 2 for bad input.

  ds_gas_check --config ds_config.json                    # 1 rank, in this process
  ds_gas_check --config ds_config.json --ranks 2          # 2 ranks through the deepspeed launcher
  deepspeed --num_gpus 2 --no_local_rank --module deepspeed.gafix.gas_check --config ds_config.json

Your own model and data: --model pkg.mod:make_model (any nn.Module; a PipelineModule with
--pipeline-stages), --data pkg.mod:make_batches (a list of (inputs, labels) tuples or dicts of
tensors, one per step; it may take the keywords steps and global_batch_size), --loss pkg.mod:loss_fn
(loss_fn(outputs, labels); without it the model returns the loss, as Hugging Face models do).
--hf-model DIR: a local Hugging Face causal LM (config, with or without weights) on synthetic token
batches of variable lengths. Models too large for an fp64 copy on every rank (or --no-reference) are
checked by comparing each split with the same micro-batches trained without accumulation.

--restart R: train on --ranks ranks up to a checkpoint, resume it on R ranks with GAS set to keep the global
batch, and compare every step after the restart with the fp64 reference of the run that never stopped.
"""

import argparse
import inspect
import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass, replace

from .options import DEFAULT_SPLITS, CheckOptions

OPTIMIZER_PRESETS = {
    "sgd": {
        "type": "SGD",
        "params": {
            "lr": 0.1
        }
    },
    # torch's AdamW (torch_adam): no JIT build of DeepSpeed's fused Adam needed for a check.
    "adamw": {
        "type": "AdamW",
        "params": {
            "lr": 1e-3,
            "weight_decay": 0.0,
            "torch_adam": True
        }
    },
    # DeepSpeed's Muon: Newton-Schulz on the matrices (or the parameters tagged use_muon), AdamW on the rest.
    "muon": {
        "type": "Muon",
        "params": {
            "lr": 0.02,
            "momentum": 0.95,
            "weight_decay": 0.0
        }
    },
    # torch's Adagrad, DeepSpeedCPUAdagrad with ZeRO-Offload.
    "adagrad": {
        "type": "Adagrad",
        "params": {
            "lr": 0.01
        }
    },
    # DeepSpeed's FusedLion (a GPU op), DeepSpeedCPULion with ZeRO-Offload.
    "lion": {
        "type": "Lion",
        "params": {
            "lr": 1e-4,
            "betas": [0.9, 0.99],
            "weight_decay": 0.0
        }
    },
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="ds_gas_check",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_input_arguments(parser)
    _add_training_arguments(parser)
    _add_loop_arguments(parser)
    _add_run_arguments(parser)
    return parser.parse_args(argv)


def _add_input_arguments(parser):
    """What is checked: the config, the model, its data and loss."""
    parser.add_argument("--config", required=True, help="DeepSpeed config file (JSON)")
    parser.add_argument("--model",
                        help="model factory 'module:function' (no arguments; returns an nn.Module, or a "
                        "PipelineModule with --pipeline-stages); default: a small built-in MLP. Without --data it "
                        "must map [batch, 8] floats to [batch, 4]")
    parser.add_argument("--data",
                        help="data factory 'module:function': returns the global batches, one per step, each an "
                        "(inputs, labels) tuple or a dict of tensors; may take the keywords steps and "
                        "global_batch_size")
    parser.add_argument("--loss",
                        help="loss factory 'module:function' called as loss(outputs, labels); default: the model "
                        "returns its loss (model(**batch) or model(inputs, labels)), or MSE on the built-in data")
    parser.add_argument("--hf-model",
                        metavar="DIR",
                        help="a local Hugging Face causal-LM directory (config.json, weights optional; nothing is "
                        "downloaded), trained on synthetic token batches of variable lengths, padding masked")


def _add_training_arguments(parser):
    """The splits, the steps, the optimizer, and the parallelism each split trains with."""
    parser.add_argument("--splits",
                        help="per-rank micro-batch x GAS splits of the same batch (default: 16x1,8x2,4x4,2x8, or "
                        "halvings of --data's fixed batch)")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps compared (default: %(default)s)")
    parser.add_argument("--optimizer",
                        default="config",
                        choices=["config", *OPTIMIZER_PRESETS],
                        help="the config's optimizer section (default; SGD lr 0.1 when it has none), or a preset")
    parser.add_argument("--pipeline-stages",
                        type=int,
                        default=0,
                        help="check the pipeline engine: a built-in PipelineModule with this many stages, "
                        "trained with train_batch()")
    parser.add_argument("--sequence-parallel",
                        type=int,
                        default=0,
                        metavar="N",
                        help="Ulysses sequence parallelism: N ranks share each sequence (the engine's mpu is "
                        "parallel_state_sp); a built-in self-attention model runs DeepSpeed's DistributedAttention on "
                        "each rank's chunk; --ranks divided by N are data-parallel")
    parser.add_argument("--sequence-parallel-loss",
                        default="share",
                        choices=["share", "gathered"],
                        help="how each sequence-parallel rank writes its loss: its chunk's share of the sample's "
                        "(default), or the shares gathered over the group and summed, as the long-sequence (ALST) "
                        "tutorial, the Hugging Face Trainer and accelerate do")


def _add_loop_arguments(parser):
    """The training loop, the data's items, what a split is compared with, and how the engine is built."""
    parser.add_argument("--loop",
                        default="step_every_micro_batch",
                        choices=["step_every_micro_batch", "boundary", "step_once"],
                        help="training loop: backward()+step() on every micro-batch (default); "
                        "set_gradient_accumulation_boundary() and one step() per batch, as accelerate does; or "
                        "one step() per batch, for managed_gradient_accumulation: false")
    parser.add_argument("--items",
                        default="fixed",
                        choices=["fixed", "variable"],
                        help="the built-in data: a sample is an item (fixed, default), or samples of 0-12 labelled "
                        "positions of 12 (variable): with \"loss_normalization\": \"per_item\" checked against the "
                        "fp64 mean over every item of the global batch; in mean mode the check reports how far the "
                        "micro-batch means are from it")
    reference = parser.add_mutually_exclusive_group()
    reference.add_argument("--no-reference",
                           dest="reference",
                           action="store_const",
                           const=False,
                           default="auto",
                           help="compare each split with the same micro-batches trained without accumulation "
                           "instead of an fp64 reference (default: only when the model is too large for an fp64 copy "
                           "on every rank, about 60M parameters)")
    reference.add_argument("--reference",
                           dest="reference",
                           action="store_const",
                           const=True,
                           help="always train the fp64 reference, whatever the model's size")
    parser.add_argument(
        "--small-buckets",
        action="store_true",
        help="ZeRO bucket, prefetch and optimizer sub-group sizes scaled to the model, so that a small "
        "model spans several, as a large one does (replaces the config's own)")
    parser.add_argument("--zero-init",
                        action="store_true",
                        help="ZeRO-3: build the model under deepspeed.zero.Init, partitioned as it is built (as "
                        "transformers builds a model for ZeRO-3); the fp64 reference is built whole")
    parser.add_argument("--compile",
                        action="store_true",
                        help="compile the engine with engine.compile() before it trains, as a training script that "
                        "calls it does (torch.compile of the model; with compile.autoep_non_moe, of the layers around "
                        "AutoEP's experts); the fp64 reference runs eager")


def _add_run_arguments(parser):
    """Where the check runs (ranks, a restart) and what it writes."""
    parser.add_argument("--ranks", type=int, default=1, help="ranks to launch when not under a launcher")
    parser.add_argument(
        "--restart",
        type=int,
        metavar="R",
        help="check a restart: train one split (--splits MxG, default 8x2) on --ranks ranks, save a "
        "checkpoint after --restart-after steps, load it on R ranks and train the rest, compared "
        "with the fp64 reference of the uninterrupted run (another R needs the config's \"checkpoint\": "
        "{\"reshard_on_load\": true})")
    parser.add_argument("--restart-split",
                        metavar="MxG",
                        help="the per-rank split after the restart (default: the same micro-batch, GAS set to keep "
                        "the global batch)")
    parser.add_argument("--restart-after", type=int, help="steps before the save (default: half of --steps)")
    parser.add_argument("--checkpoint-dir",
                        help="where --restart saves its checkpoint, on storage every rank reads (default: a "
                        "temporary directory, removed after the check)")
    # Set by --restart for each of its two launches.
    parser.add_argument("--restart-phase", choices=["save", "resume"], help=argparse.SUPPRESS)
    parser.add_argument("--saved-by", default="", help=argparse.SUPPRESS)
    parser.add_argument("--preflight",
                        action="store_true",
                        help="only check the config as the engine parses it (unknown or misspelled keys, values "
                        "the engine refuses, \"auto\" values), without training: exit 0, or 2 with one line each")
    parser.add_argument("--json", help="also write the results to this JSON file (rank 0)")
    parser.add_argument("--plot", metavar="FILE.png", help="draw loss, grad norm and update error per step (rank 0)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def default_splits(per_rank):
    """Up to four halvings of a per-rank batch: 16 -> 16x1, 8x2, 4x4, 2x8."""
    splits, gas = [], 1
    while per_rank % gas == 0 and len(splits) < 4:
        splits.append((per_rank // gas, gas))
        gas *= 2
    return splits


def parse_splits(text):
    try:
        splits = [tuple(int(n) for n in item.lower().split("x")) for item in text.split(",")]
    except ValueError:
        splits = []
    if not splits or any(len(s) != 2 or min(s) < 1 for s in splits):
        raise ValueError(f"--splits '{text}': expected e.g. 16x1,8x2 (micro-batch x GAS, per rank)")
    if len({micro * gas for micro, gas in splits}) != 1:
        raise ValueError(f"--splits '{text}': micro-batch x GAS must be the same in every split (the same batch)")
    return splits


def load_config(path, optimizer):
    try:
        with open(path) as f:
            text = f.read()
        config = json.loads(text)
    except OSError as err:
        raise ValueError(f"--config {path}: {err.strerror}") from None
    except json.JSONDecodeError as err:
        from .config_rules import json_error
        raise ValueError(json_error(path, text, err)) from None
    if not isinstance(config, dict):
        raise ValueError(f"--config {path}: expected a JSON object")
    notes = []
    if optimizer != "config":
        config["optimizer"] = OPTIMIZER_PRESETS[optimizer]
    elif "optimizer" not in config:
        config["optimizer"] = OPTIMIZER_PRESETS["sgd"]
        notes.append("config has no 'optimizer' section: checked with SGD, lr 0.1")
    if "scheduler" in config and config["optimizer"].get("type", "").lower() == "muon":
        # The reference's Muon keeps its learning rates apart from param_groups, where a schedule sets them.
        notes.append("config key 'scheduler' left out with Muon: the reference keeps the learning rate constant")
        config.pop("scheduler")
    return config, notes


PREFLIGHT_DONE = "DS_GAS_CHECK_PREFLIGHT_DONE"


def run_preflight(config, splits, world, args, told=True):
    """The pre-flight (preflight.py) on ``world`` ranks: None to go on, else the exit status (2 on an error;
    with --preflight, 0 when there is none). Its notes are printed first (errors only without ``told``: the same
    config's pre-flight on another number of ranks printed them)."""
    from .preflight import TOLD_ALWAYS, engine_paths, preflight
    found = preflight(config, splits or list(DEFAULT_SPLITS), world, args.pipeline_stages)
    rank0 = os.environ.get("RANK", "0") == "0"
    if rank0:
        for error in found.errors:
            print(f"ds_gas_check: error: {error}", file=sys.stderr)
    if found.errors:
        return 2
    head = [f"ds_gas_check --preflight: {args.config}: {engine_paths(config)}: the engine accepts it"
            ] if args.preflight else []
    # The coverage map's rows for the keys the config sets: all of them with --preflight; else those a user must
    # hear of (a path the fork has not checked against fp64, or checks only on a GPU).
    told = [(status, keys, note) for status, keys, note in found.coverage
            if args.preflight and status != "off-path" or status in TOLD_ALWAYS]
    mapped = [f"map: {status}: {', '.join(keys)}: {note}" for status, keys, note in told]
    lines = head + mapped + [f"note: {note}" for note in found.notes]
    if rank0 and lines and told:
        print("\n".join(lines), flush=True)
    return 0 if args.preflight else None


def under_launcher():
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def world_of(args):
    """The ranks the check runs on: the launcher's, or --ranks before this command launches them."""
    return int(os.environ["WORLD_SIZE"]) if under_launcher() else args.ranks


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def relaunch(argv, ranks):
    """Run this check on ``ranks`` ranks through the deepspeed launcher; return its exit status."""
    args = command_line(argv)
    cmd = [
        sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus",
        str(ranks), "--no_local_rank", "--master_port",
        str(free_port()), "--module", "deepspeed.gafix.gas_check", *args
    ]
    return subprocess.call(cmd, env=dict(os.environ, **{PREFLIGHT_DONE: "1"}))


def command_line(argv):
    return list(sys.argv[1:] if argv is None else argv)


def single_process_env():
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                       ("MASTER_PORT", str(free_port()))):
        os.environ.setdefault(key, value)


def workload_factories(args):
    """(make_model, data, loss_fn) from the command line; ``data`` takes (steps, global_batch_size)."""
    from .batches import call_data_factory
    from .models import builtin_model, load_factory
    if args.hf_model and (args.model or args.data):
        raise ValueError("--hf-model brings its own model and data: not with --model or --data")
    if args.items == "variable" and (args.hf_model or args.model or args.data):
        raise ValueError("--items variable checks the built-in model and data: not with --model, --data or "
                         "--hf-model (their loss decides the items)")
    if args.hf_model and args.zero_init:
        # transformers initialises and loads a model built under zero.Init right only through its own DeepSpeed
        # integration; built under the checker's, the model would not be the reference's.
        raise ValueError("--hf-model and --zero-init: not yet (transformers builds a ZeRO-3 model under its own "
                         "DeepSpeed integration); --model with your factory takes --zero-init")
    if args.hf_model and args.pipeline_stages:
        raise ValueError("--hf-model and --pipeline-stages: a Hugging Face model is not a PipelineModule")
    if args.sequence_parallel and (args.hf_model or args.model or args.data or args.pipeline_stages):
        raise ValueError("--sequence-parallel checks the built-in self-attention model (Ulysses attention on each "
                         "rank's chunk of the sequence): not with --hf-model, --model, --data or --pipeline-stages")
    if args.data and not args.model:
        raise ValueError("--data needs --model: the built-in MLP takes the built-in data only")
    if args.loss and not (args.data or args.hf_model):
        raise ValueError("--loss needs --data (the built-in data has its own loss)")
    loss_fn = load_factory(args.loss, "--loss") if args.loss else None
    if args.hf_model:
        from . import hf
        return hf.model_factory(
            args.hf_model), lambda steps, size: hf.token_batches(args.hf_model, steps, size), loss_fn
    if args.model:
        make_model = load_factory(args.model, "--model")
    else:  # the built-in MLP (as a PipelineModule with --pipeline-stages: check.py builds that one)
        make_model = None if args.pipeline_stages or args.sequence_parallel else builtin_model
    if not args.data:
        return make_model, None, None
    factory = load_factory(args.data, "--data")
    sized = "global_batch_size" in inspect.signature(factory).parameters
    built = {}

    def data(steps, size):
        # A factory of its own batch size is called once: its size sets the default splits, then it is trained.
        key = (steps, size) if sized else steps
        if key not in built:
            built[key] = call_data_factory(factory, steps, size)
        return built[key]

    data.sized = sized
    return make_model, data, loss_fn


def fixed_data_splits(data, steps, world, pipeline_stages):
    """Default splits for a data factory whose batch size is its own: halvings of its per-rank share."""
    from .batches import check_batches
    size = check_batches(data(steps, None), "--data")
    dp_world = world // (pipeline_stages or 1)
    if size % dp_world:
        raise ValueError(f"--data gives global batches of {size} samples: not divisible by {dp_world} "
                         "data-parallel rank(s)")
    return default_splits(size // dp_world)


def sequence_parallel(args):
    """--sequence-parallel's SequenceParallel, or None; a degree that cannot split --ranks is refused here, before
    any rank starts."""
    if not args.sequence_parallel:
        return None
    from .sequence import SequenceParallel
    sequence = SequenceParallel(args.sequence_parallel, args.sequence_parallel_loss)
    world = world_of(args)
    if world % sequence.size:
        raise ValueError(f"--sequence-parallel {sequence.size} does not divide {world} ranks")
    if args.restart is not None:
        raise ValueError("--restart with --sequence-parallel: the restart check runs without sequence parallelism")
    return sequence


def number_refusal(args):
    """The first numeric option out of its range, in one line naming it; None when every one is in range."""
    stages, sequence = args.pipeline_stages, args.sequence_parallel
    for option, value, least in (("--ranks", args.ranks, 1), ("--steps", args.steps, 1),
                                 ("--pipeline-stages", stages, 0), ("--sequence-parallel", sequence, 0)):
        if value < least:
            return f"{option} {value}: at least {least}" + (" (0: none)" if least == 0 else "")
    return None


def stages_refusal(args):
    """--pipeline-stages that do not divide the ranks, in one line; None when they do."""
    stages = args.pipeline_stages
    world = world_of(args)
    ranks = f"{world} rank(s)" + ("" if under_launcher() else f" (--ranks {world})")
    if stages and world % stages:
        return (f"--pipeline-stages {stages}: each stage runs on its own ranks, so the stages must divide the "
                f"{ranks}: e.g. --ranks {stages}")
    return None


def ranks_in_words(world, args, sequence):
    """"2 rank(s)", and how they divide where not every rank holds other samples: a split's "x ranks" counts every
    rank, and only the data-parallel ones add samples to the global batch."""
    stages, sp = args.pipeline_stages or 1, sequence.size if sequence else 1
    if stages == 1 and sp == 1:
        return f"{world} rank(s)"
    parts = [f"{world // stages // sp} data-parallel"]
    parts += [f"{stages} pipeline stages"] * (stages > 1) + [f"{sp} sequence-parallel"] * (sp > 1)
    return f"{world} rank(s) = {' x '.join(parts)}"


@dataclass(frozen=True)
class Request:
    """The command line, read and checked once: what the check trains (``options``, the library's terms) and what
    the command does around it. Every refusal of bad input is raised while it is made (``prepare``)."""
    args: argparse.Namespace  # the flags as given, for what only the command line has (--json, --plot, --ranks)
    config: dict
    notes: list
    options: CheckOptions  # its splits None until the ranks know their number, where --splits is not given
    restart_plan: object = None  # restart.RestartPlan of ds_gas_check --restart, before its two launches


def prepare(args):
    """The Request of ``args``; ValueError naming the flag, file or key on bad input."""
    refusal = number_refusal(args)
    if refusal:
        raise ValueError(refusal)
    splits = parse_splits(args.splits) if args.splits else None
    config, notes = load_config(args.config, args.optimizer)
    make_model, data, loss_fn = workload_factories(args)
    sequence = sequence_parallel(args)
    if args.plot:
        from .plot import pyplot
        pyplot()
    restart_plan = None
    if args.restart is not None and args.restart_phase is None:
        from .restart import plan_restart, same_objective
        from .training import per_item_mode
        if under_launcher():
            raise ValueError("--restart launches its two runs itself, on --ranks and then R ranks: run "
                             "ds_gas_check --ranks N --restart R, not under the deepspeed launcher")
        restart_plan = plan_restart(args, splits, parse_splits)
        same_objective(restart_plan, per_item_mode(config), data is None and args.items == "fixed")
    refusal = stages_refusal(args)
    if refusal:
        raise ValueError(refusal)
    options = CheckOptions(make_model, splits, args.steps, args.pipeline_stages, args.loop, data, loss_fn,
                           args.reference, args.items, args.small_buckets, sequence, args.zero_init, args.compile)
    return Request(args, config, notes, options, restart_plan)


def preflight_verdict(request):
    """The pre-flight on every number of ranks the check runs on: None to go on, else the exit status."""
    plan, args = request.restart_plan, request.args
    if plan is not None:
        from .restart import reshard_refusal
        refusal = reshard_refusal(plan, request.config, f"--restart {args.restart}")
        if refusal:
            print(f"ds_gas_check: error: {refusal}", file=sys.stderr)
            return 2
    checks = ([([plan.before], world_of(args)),
               ([plan.after], plan.ranks_after)] if plan is not None else [(request.options.splits, world_of(args))])
    for index, (phase_splits, phase_world) in enumerate(checks):
        verdict = run_preflight(request.config, phase_splits, phase_world, args, told=index == 0)
        # An error stops at once; --preflight's pass (0) is told once every number of ranks passed.
        if verdict == 2 or verdict is not None and index == len(checks) - 1:
            return verdict
    return None


def main(argv=None):
    args = parse_args(argv)
    try:
        request = prepare(args)
    except ValueError as err:
        print(f"ds_gas_check: error: {err}", file=sys.stderr)
        return 2
    # Before any rank starts (once: the launched ranks skip it), what the engine would refuse is refused here.
    if os.environ.get(PREFLIGHT_DONE) != "1":
        verdict = preflight_verdict(request)
        if verdict is not None:
            return verdict
    if request.restart_plan is not None:
        from .restart import run_both
        return run_both(args, command_line(argv), request.restart_plan, relaunch)
    if not under_launcher():
        if args.ranks > 1:
            return relaunch(argv, args.ranks)
        single_process_env()
    import deepspeed
    import deepspeed.comm as dist
    deepspeed.init_distributed()
    try:
        return run_on_ranks(request)
    finally:
        # Down before exit: communication threads still running at interpreter teardown abort the ranks
        # ("terminate called without an active exception", exit -6) after the check has printed its result.
        # Together: a rank that tears its groups down while another is still printing or writing can abort it
        # the same way.
        dist.barrier()
        dist.destroy_process_group()


def run_on_ranks(request):
    """The check on this launch's ranks, its result printed on rank 0: the exit status."""
    import deepspeed.comm as dist
    from .check import make_plan, run_check
    from deepspeed.runtime.config import DeepSpeedConfigError
    from .preflight import one_line
    from .progress import Progress
    from .restart import Restart, RestartError
    args, options = request.args, request.options
    restart = None if args.restart_phase is None else Restart(args.checkpoint_dir, args.restart_after,
                                                              args.restart_phase == "resume", args.saved_by)
    rank0 = dist.get_rank() == 0
    try:
        if options.splits is None:
            options = replace(options, splits=split_defaults(options, dist.get_world_size()))
        progress = Progress(len(options.splits), enabled=rank0 and not args.quiet)
        check = run_check(make_plan(request.config, options, progress, restart))
    except (ValueError, DeepSpeedConfigError) as err:
        # Bad input, or a config the engine refuses only once it builds the model or the optimizer: every rank
        # raises the same; one line says it.
        if rank0:
            print(f"ds_gas_check: error: {one_line(err)}", file=sys.stderr)
        return 2
    except RestartError as err:
        # The config trains, but the engine cannot resume it on these ranks: the restart check's finding.
        if rank0:
            print(f"ds_gas_check --restart: FAIL: {one_line(err)}", file=sys.stderr)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"error": one_line(err)}, f)
        return 1
    if rank0 and report(request, check.results, request.notes + check.notes, restart) is not None:
        return 2
    if all(r.passed for r in check.results):
        return 0
    # 3: nothing failed, but a split could not be decided at this precision (UNRESOLVED).
    return 3 if all(r.passed or r.unresolved for r in check.results) else 1


def split_defaults(options, world):
    """The splits of a check run without --splits: halvings of --data's own batch, or DEFAULT_SPLITS."""
    data = options.data
    if data is not None and not data.sized:
        return fixed_data_splits(data, options.steps, world, options.pipeline_stages)
    return list(DEFAULT_SPLITS)


def title_of(request, results, restart):
    """The result table's first line: what was checked, in the user's terms."""
    import deepspeed
    import deepspeed.comm as dist
    from .check import config_dtype
    from .restart import title as restart_title
    args, config, sequence = request.args, request.config, request.options.sequence
    zero = config.get("zero_optimization", {}).get("stage", 0)
    parts = [
        f"ds_gas_check: deepspeed {deepspeed.__version__}",
        ranks_in_words(dist.get_world_size(), args, sequence), f"{args.config}: " +
        (f"model {args.hf_model or args.model}, " if args.hf_model or args.model else "") + f"ZeRO {zero}",
        config_dtype(config), f"optimizer {config['optimizer'].get('type')}"
    ]
    optional = [(args.pipeline_stages, lambda: f"pipeline {args.pipeline_stages} stages"),
                (sequence, lambda: sequence.title()),
                (config.get("loss_normalization") == "per_item", lambda: "loss_normalization per_item"),
                (args.items == "variable", lambda: "variable items per sample"),
                (args.zero_init, lambda: "built under zero.Init"), (args.compile, lambda: "engine compiled")]
    parts += [words() for given, words in optional if given] + [f"{len(results[0].norms)} steps"]
    parts += [restart_title(restart)] if restart else []
    return ", ".join(parts)


def report(request, results, notes, restart):
    """Print the results (and write --json, --plot) on rank 0; None, or 2 when the plot could not be drawn."""
    from .formatting import format_results
    args = request.args
    title = title_of(request, results, restart)
    print("\n".join([format_results(results, title)] + [f"note: {n}" for n in notes]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dict(vars(r), name=r.name, passed=r.passed, verdict=r.verdict) for r in results], f, indent=1)
    if args.plot:
        from .plot import plot_check
        try:
            plot_check(args.plot, results, title)
        except ValueError as err:
            print(f"ds_gas_check: error: {err}", file=sys.stderr)
            return 2
        print(f"plot: {args.plot}")
    return None


if __name__ == "__main__":
    sys.exit(main())
