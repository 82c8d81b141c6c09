# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""A rank killed (SIGKILL) anywhere in training or inside save_checkpoint: the other ranks end within a stated time,
and the restart resumes from the newest checkpoint every rank finished and continues the uninterrupted run.

2 CPU ranks train STEPS steps of one global batch each, saving every EVERY steps (tests/workers/crash_resume.py). A
trial, drawn from its seed: a configuration, the rank killed, and where: before a forward, backward or optimizer step
of a training step, or inside the n-th save while writing one of that rank's files, with none, half or all of its
bytes on disk. The restart (on 2 ranks, or on 1 with ``"checkpoint": {"reshard_on_load": true}``) loads ``latest``
and trains to the end. It must resume at the last save every rank finished before the kill (or at the save being
written, where the kill came after the last byte of its file), and end with the uninterrupted run's weights: bit for
bit on 2 ranks, within another split's rounding on 1. On 0.19.8 rank 0 writes
``latest`` while another rank is still writing, so a rank killed there leaves ``latest`` naming a tag whose files
are cut, and the restart fails to load it (patch Write-checkpoints-so-that-a-rank-killed-inside-save_).

``DS_GAFIX_CRASH_TRIALS_JSON=FILE`` writes every trial's outcome there.
"""

import json
import os
import random
import time
from pathlib import Path

import pytest
import torch

from helpers.continuation import TOLERANCE, dtype_of, relative_error
from toolkit.launch import deepspeed_command, launch_cases, run_launcher
from helpers.selection import selected_params

WORKER = Path(__file__).parent / "workers" / "crash_resume.py"
STEPS, EVERY, GLOBAL = 6, 2, 8  # the worker's
CONFIGS = ["zero1_fp32_clip", "zero2_fp32_clip", "zero3_fp32_clip", "zero1_bf16_clip"]
PHASES = ["forward", "backward", "step"]
TRIALS = 50
# CI's trial (CI's 30 minutes: the uninterrupted run, one kill and one restart): rank 1 killed before writing its
# file of the second save, restarted on 2 ranks (0.19.8 resumes from the cut save and fails); restarts on 1 rank are
# test_resume_world_size's in CI.
CI_SEEDS = {4}
# The kill run goes through the deepspeed launcher, which users' ranks die under: it polls its ranks every second and
# ends the others once one has died.
TEARDOWN_SECONDS = 30
# A restart trains at most 6 steps of a tiny model (20-40 s here); longer is a hang on what the kill left.
RESTART_TIMEOUT = 240
FP32_REORDERED = 1e-6


def config_of(seed):
    return random.Random(seed).choice(CONFIGS)


def draw(seed, files_per_save):
    """Trial ``seed``: where one rank is killed, and on how many ranks the run restarts. ``files_per_save``: rank ->
    the number of files each of the uninterrupted run's saves wrote there."""
    rng = random.Random(seed)
    config = rng.choice(CONFIGS)
    rank = rng.choice([0, 1])
    if rng.random() < 0.6:
        save = rng.randint(1, STEPS // EVERY)
        kill = {
            "rank": rank,
            "where": "save",
            "save": save,
            "file": rng.randrange(files_per_save[rank][save - 1]),
            "fraction": rng.choice([0.0, 0.5, 1.0])
        }
        expected = EVERY * (save - 1)
    else:
        step = rng.randrange(STEPS)
        kill = {"rank": rank, "where": "train", "step": step, "phase": rng.choice(PHASES)}
        expected = EVERY * (step // EVERY)
    return {
        "seed": seed,
        "config": config,
        "kill": kill,
        "restart_ranks": rng.choice([2, 2, 1]),
        "expected_resume_at": expected
    }


def resumable_at(trial):
    """The steps a restart may resume at: the last save every rank finished before the kill; or the save being
    written, where the kill came after every byte of its file was written (an engine may count that file whole)."""
    kill = trial["kill"]
    if kill["where"] == "save" and kill["fraction"] == 1.0:
        return {trial["expected_resume_at"], EVERY * kill["save"]}
    return {trial["expected_resume_at"]}


def where(trial):
    kill = trial["kill"]
    if kill["where"] == "train":
        return f"rank {kill['rank']}, before the {kill['phase']} of step {kill['step']}"
    return (f"rank {kill['rank']}, save {kill['save']} (step {EVERY * kill['save']}), file {kill['file']}, "
            f"{kill['fraction']:.0%} written")


def seed_params():
    for seed in range(TRIALS):
        yield pytest.param(seed, marks=[] if seed in CI_SEEDS else [pytest.mark.slow], id=f"trial{seed}")


@pytest.fixture(scope="module")
def trials(tmp_path_factory, extensions_dir, request):
    """seed -> the trial, its kill run and its restart, for the seeds this run selected."""
    root = tmp_path_factory.mktemp("crash-resume")
    seeds = selected_params(request, "seed", "trials")
    configs = sorted({config_of(seed) for seed in seeds}, key=CONFIGS.index)
    reference = launch_cases(
        WORKER,
        2,
        extensions_dir=extensions_dir,
        timeout=900,
        extra_args=["--uninterrupted", str(root / "uninterrupted"), "--configs", ",".join(configs)])
    outcomes, record = {}, os.environ.get("DS_GAFIX_CRASH_TRIALS_JSON")
    for seed in seeds:
        config = config_of(seed)
        uninterrupted = reference.case(f"uninterrupted/{config}")
        trial = draw(seed, [rank["files_per_save"] for rank in uninterrupted])
        trial_dir = root / f"trial{seed}"
        trial_dir.mkdir()
        killed_at, finished = trial_dir / "killed_at", trial_dir / "finished"
        run = run_launcher(WORKER,
                           2, [
                               "--kill-run",
                               str(trial_dir / "checkpoints"), "--config", config, "--kill",
                               json.dumps(trial["kill"]), "--killed-at",
                               str(killed_at), "--finished",
                               str(finished)
                           ],
                           timeout=300,
                           extensions_dir=extensions_dir,
                           launcher=deepspeed_command())
        ended = time.time()
        trial.update(returncode=run.returncode,
                     kill_came=killed_at.exists() and not finished.exists(),
                     teardown_seconds=round(ended - float(killed_at.read_text()), 1) if killed_at.exists() else None,
                     log_tail=run.tail(15))
        # A restart of its own per trial: one whose ranks hang on what the kill left fails that trial only.
        checkpoints = trial_dir / "checkpoints"
        try:
            restart = launch_cases(WORKER,
                                   trial["restart_ranks"],
                                   extensions_dir=extensions_dir,
                                   timeout=RESTART_TIMEOUT,
                                   extra_args=["--resume", f"trial{seed}:{config}={checkpoints}"])
            trial["restart"] = restart.case(f"resume-trial{seed}/{config}")
        except AssertionError as err:  # LaunchError (a hang, a rank without results) or a case that raised
            message = str(err)
            trial["restart_error"] = message if len(message) < 4000 else f"{message[:1000]}\n...\n{message[-3000:]}"
        trial["uninterrupted"] = uninterrupted
        outcomes[seed] = trial
        if record:  # after every trial: a run stopped part way keeps what it did
            Path(record).write_text(json.dumps([report(trial) for trial in outcomes.values()], indent=1) + "\n")
    return outcomes


def final_error(trial):
    """The restart's final weights against the uninterrupted run's (relative), after checking the ranks agree."""
    ranks = trial["restart"]
    assert all(rank["weights"] == ranks[0]["weights"] for rank in ranks), "the restart's ranks disagree"
    expected = torch.tensor(trial["uninterrupted"][0]["weights"], dtype=torch.float64)
    return relative_error(expected, torch.tensor(ranks[0]["weights"], dtype=torch.float64))


def report(trial):
    """What the evidence keeps of a trial."""
    kept = {
        key: trial[key]
        for key in ("seed", "config", "kill", "restart_ranks", "expected_resume_at", "returncode", "kill_came",
                    "teardown_seconds")
    }
    kept["where"] = where(trial)
    if "restart" in trial:
        kept["resumed_at"] = trial["restart"][0]["resumed_at"]
        try:
            kept["final_error"] = final_error(trial)
        except AssertionError as err:
            kept["restart_error"] = str(err)
    else:
        # The error's first line says what failed (a timeout: a hang); a raising case's last line names the exception.
        lines = trial["restart_error"].strip().splitlines()
        kept["restart_error"] = lines[0] if "timed out" in lines[0] else lines[-1]
    return kept


@pytest.mark.parametrize("seed", seed_params())
def test_killed_rank_then_restart(trials, seed):
    trial = trials[seed]
    name = f"trial {seed} ({trial['config']}; {where(trial)}; restart on {trial['restart_ranks']} rank(s))"
    assert trial["kill_came"], f"{name}: the kill point never came\n{trial['log_tail']}"
    assert trial["returncode"] != 0, f"{name}: the launcher reported success for a killed rank"
    assert trial["teardown_seconds"] <= TEARDOWN_SECONDS, (
        f"{name}: the other rank ran on {trial['teardown_seconds']} s after the kill")
    assert "restart_error" not in trial, f"{name}: the restart failed:\n{trial['restart_error']}"
    restarted = trial["restart"]
    for rank in restarted:
        assert rank["resumed_at"] in resumable_at(trial), (
            f"{name}: resumed at step {rank['resumed_at']}, not at the last finished save "
            f"(step {trial['expected_resume_at']})")
        assert rank["state"]["global_samples"] == GLOBAL * rank["resumed_at"], name
        assert (rank["final_state"]["global_steps"], rank["final_state"]["global_samples"]) == (STEPS, GLOBAL * STEPS)
    error = final_error(trial)
    same_split = trial["restart_ranks"] == 2
    tolerance = 0.0 if same_split else (TOLERANCE[dtype_of(trial["config"])] or FP32_REORDERED)
    print(f"{name}: resumed at step {restarted[0]['resumed_at']}, final weights {error:.3g} from the "
          f"uninterrupted run's; the other rank ended {trial['teardown_seconds']} s after the kill")
    assert error <= tolerance, (f"{name}: the final weights are {error:.3g} (relative) from the uninterrupted run's "
                                f"(tolerance {tolerance})")
