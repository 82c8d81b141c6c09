# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""``ds_gas_check --restart R``: does a run saved on one number of ranks resume on another and go on as if it never
stopped?

Two launches. The first trains the steps up to the save on ``--ranks`` ranks (one split, compared with the fp64
reference as any check) and saves a checkpoint with ``engine.save_checkpoint``; the second starts on R ranks with the
same global batch, loads it with ``engine.load_checkpoint`` and trains the remaining steps, each compared with the
fp64 reference of the whole run from the same initial weights. The weights it loaded are compared with the
reference's at the step of the save, and every step after it from there, so that a lost optimizer state or learning
rate shows at the first step it moves. This module settles the two launches and runs them; training.py saves and
loads, check.py compares.
"""

import json
import os
import shutil
import tempfile
from dataclasses import dataclass

DEFAULT_SPLIT = (8, 2)
# Exit statuses of a check, from the least to the most severe (cli.py's docstring): the two launches' worst is
# the restart check's.
SEVERITY = (0, 3, 1, 2)


@dataclass(frozen=True)
class Restart:
    """One launch of a restart check: the checkpoint directory, the step the save follows, and which launch."""
    directory: str
    step: int
    resume: bool  # False: train up to ``step`` and save; True: load, then train the steps after it
    saved_by: str = ""  # the split that saved, "micro x GAS x ranks" (resume only)


class RestartError(RuntimeError):
    """The engine could not resume from the checkpoint (every rank raises it)."""


@dataclass(frozen=True)
class RestartPlan:
    """What the two launches of ``--restart`` train: per-rank (micro, GAS) before and after, ranks, and the step."""
    before: tuple
    after: tuple
    ranks_before: int
    ranks_after: int
    step: int


def _split_text(split):
    return f"{split[0]}x{split[1]}"


def plan_restart(args, splits, parse_splits):
    """The restart's two splits and step from the command line; ValueError names the option at fault."""
    if args.restart < 1:
        raise ValueError(f"--restart {args.restart}: the number of ranks to resume on must be at least 1")
    for given, option in ((args.pipeline_stages, "--pipeline-stages"), (args.plot, "--plot"), (args.reference is False,
                                                                                               "--no-reference")):
        if given:
            raise ValueError(f"--restart and {option}: the restart check compares data-parallel runs with the fp64 "
                             "reference (no plot is drawn for it)")
    if splits is not None and len(splits) != 1:
        raise ValueError("--restart checks one split before the restart (--splits MxG) and one after it "
                         "(--restart-split MxG)")
    before = tuple(splits[0]) if splits else DEFAULT_SPLIT
    global_batch = before[0] * before[1] * args.ranks
    if global_batch % args.restart:
        raise ValueError(f"--restart {args.restart}: the global batch of {global_batch} ({_split_text(before)} on "
                         f"{args.ranks} rank(s)) does not divide into {args.restart} ranks' shares")
    per_rank = global_batch // args.restart
    if args.restart_split:
        after = parse_splits(args.restart_split)
        if len(after) != 1 or after[0][0] * after[0][1] != per_rank:
            raise ValueError(f"--restart-split {args.restart_split}: one split whose micro-batch x GAS is {per_rank}, "
                             f"each of {args.restart} rank(s)' share of the global batch of {global_batch}")
        after = tuple(after[0])
    elif per_rank % before[0] == 0:
        after = (before[0], per_rank // before[0])  # the micro-batch kept, GAS adjusted to the global batch
    else:
        raise ValueError(f"--restart {args.restart}: each rank's share of the global batch ({per_rank}) is not a "
                         f"multiple of the micro-batch {before[0]}: give --restart-split MxG (M x G = {per_rank})")
    step = args.steps // 2 if args.restart_after is None else args.restart_after
    if not 1 <= step < args.steps:
        raise ValueError(f"--restart-after {step}: the save must follow a step before the last of --steps "
                         f"{args.steps} (1 to {args.steps - 1})")
    return RestartPlan(before, after, args.ranks, args.restart, step)


def same_objective(plan, per_item, uniform_items):
    """ValueError where the resumed split trains another objective than the one it resumes: in mean mode each
    micro-batch's loss is its own mean, so another micro-batch size changes the loss unless every micro-batch holds
    the same items (the built-in data)."""
    if plan.before[0] != plan.after[0] and not per_item and not uniform_items:
        raise ValueError(f"--restart-split {_split_text(plan.after)} changes the micro-batch ({plan.before[0]} to "
                         f"{plan.after[0]}): each micro-batch's loss is the mean over its own items, so the run after "
                         "the restart would train another objective; keep the micro-batch, or set "
                         "\"loss_normalization\": \"per_item\"")


def reshard_refusal(plan, config, restart_option):
    """Why ``config`` cannot resume on ``plan``'s ranks after (one line), or None: ZeRO's optimizer states are
    partitioned by the number of ranks, and the engine refuses them on another number unless it reshards them on
    load. Told in the pre-flight, before the first launch trains."""
    zero = config.get("zero_optimization") or {}
    checkpoint = config.get("checkpoint") or {}
    if (plan.ranks_before == plan.ranks_after or zero.get("stage", 0) < 1 or checkpoint.get("reshard_on_load")
            or checkpoint.get("load_universal") or (zero.get("offload_optimizer") or {}).get("device") == "nvme"):
        return None
    return (f"{restart_option}: a checkpoint saved on {plan.ranks_before} rank(s) resumed on {plan.ranks_after}: "
            f"ZeRO stage {zero['stage']} partitions its optimizer states by the number of ranks, so the engine loads "
            "them on another number only with \"checkpoint\": {\"reshard_on_load\": true} in the config; add it, "
            f"or resume on {plan.ranks_before} rank(s)")


def run_both(args, argv, plan, launch):
    """Launch the saving run, then (when it did not fail) the resuming one; the worst of their exit statuses.
    ``launch(argv, ranks)`` runs one launch of ds_gas_check and returns its exit status."""
    directory = args.checkpoint_dir or tempfile.mkdtemp(prefix="ds_gas_check_restart_")
    saved_by = f"{plan.before[0]} x {plan.before[1]} x {plan.ranks_before}"
    outputs = {}
    statuses = []
    try:
        for phase, ranks, split in (("save", plan.ranks_before, plan.before), ("resume", plan.ranks_after,
                                                                               plan.after)):
            phase_argv = list(argv) + [
                "--splits",
                _split_text(split), "--checkpoint-dir", directory, "--restart-phase", phase, "--restart-after",
                str(plan.step), "--saved-by", saved_by
            ]
            if args.json:
                outputs[phase] = os.path.join(directory, f"results-{phase}.json")
                phase_argv += ["--json", outputs[phase]]
            statuses.append(launch(phase_argv, ranks))
            if statuses[-1] not in (0, 3):
                break
        if len(statuses) == 1:
            print(
                f"ds_gas_check --restart: the run before the restart did not pass (exit {statuses[0]}): the "
                "restart is not checked",
                flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(_merged_results(outputs, statuses), f, indent=1)
    finally:
        if not args.checkpoint_dir:
            shutil.rmtree(directory, ignore_errors=True)
    unknown = [status for status in statuses if status not in SEVERITY]
    return unknown[0] if unknown else max(statuses, key=SEVERITY.index)


def _merged_results(outputs, statuses):
    """Both launches' results for --json: each launch's own, or why there are none (``{"error": ...}``)."""
    merged = {}
    for (phase, path), key in zip((("save", outputs.get("save")), ("resume", outputs.get("resume"))),
                                  ("saved", "resumed")):
        if path is None:  # not launched: the run before the restart did not pass
            merged[key] = {"error": f"not run: the run before the restart did not pass (exit {statuses[0]})"}
        elif os.path.isfile(path):
            with open(path) as f:
                merged[key] = json.load(f)
        else:  # stopped before its results: bad input, or a crash its output shows
            status = statuses[len(merged)]
            merged[key] = {
                "error": f"the {phase} launch exited {status} before writing its results (its output "
                "above says why)"
            }
    return merged


def title(restart):
    """What a launch of the restart check did, for its report's title."""
    if restart.resume:
        return f"resumed after step {restart.step} from the checkpoint split {restart.saved_by} saved"
    return f"saved after step {restart.step} to {restart.directory}"
