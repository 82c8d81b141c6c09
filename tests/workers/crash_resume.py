# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Rank side of tests/test_crash_resume.py: a run that saves every EVERY steps and has one rank killed (SIGKILL) at a
chosen point, and the restart that resumes from what it left.

``--kill-run DIR --config NAME --kill JSON``: trains NAME from step 0 towards STEPS, saving under DIR every EVERY
steps (default tags, ``latest``), and the rank the kill names kills itself there: ``{"rank": r, "where": "train",
"step": s, "phase": "forward" | "backward" | "step"}`` (before that call of micro-batch 0 of global step s), or
``{"rank": r, "where": "save", "save": n, "file": i, "fraction": f}`` (in the n-th save, while writing the i-th file
this rank writes there: f of its bytes written to the path the engine gave, 0 for none, 1 for all, then killed). It
writes the time of the kill to ``--killed-at`` first. A run whose kill point never comes writes ``--finished``. With
``"hold": true`` the rank writes the time and waits there instead, for the test to kill its node. With
``--resume-latest`` it loads the newest checkpoint under DIR first, as a script restarted by ``--max_restarts`` does.

Otherwise the cases run under helpers/rank_cases.py: ``uninterrupted/<config>`` (``--uninterrupted DIR``) trains all
STEPS with the same saves and reports the weights and how many files each save wrote on each rank;
``resume-<label>/<config>`` (``--resume LABEL:CONFIG=DIR``) builds the engine, loads ``latest`` from DIR with
``"checkpoint": {"reshard_on_load": true}`` (nothing there: it starts at step 0), trains up to STEPS with the same
saves and reports the step it resumed at, the restored state and the weights. The model, data and configurations are
tests/workers/checkpoint_swap.py's: each step trains one global batch whatever the number of ranks.
"""

import argparse
import io
import json
import os
import signal
import time
from pathlib import Path

import torch  # noqa: E402

import deepspeed.comm as dist  # noqa: E402
from checkpoint_swap import CONFIGS, build, state, train_steps, weights  # noqa: E402
from helpers.rank_cases import force_fp16_on_cpu, run_cases  # noqa: E402

STEPS, EVERY = 6, 2
INITIAL_SEED = 1234


def train_with_saves(engine, config, save_dir, before=lambda step, micro, phase: None, on_save=lambda n: None):
    """From the engine's global step to STEPS, saving under ``save_dir`` after every EVERY-th step (``on_save(n)``
    first, n counting the run's saves from 1)."""
    saves = 0
    while engine.global_steps < STEPS:
        train_steps(engine, config, engine.global_steps, 1, before)
        if engine.global_steps % EVERY == 0:
            saves += 1
            on_save(saves)
            engine.save_checkpoint(save_dir)


class SaveCounter:
    """Counts the files (torch.save calls) each save writes on this rank; with ``cut`` ({"save": n, "file": i,
    "fraction": f, "killed_at": path}), writes f of the i-th file of the n-th save to the path the engine gave and
    kills this process there."""

    def __init__(self, cut=None):
        self.per_save, self.cut, self.real_save = [], cut, torch.save
        torch.save = self.save

    def start(self, n):
        self.per_save.append(0)

    def save(self, obj, f, *args, **kwargs):
        cut = self.cut
        if cut and self.per_save and (len(self.per_save), self.per_save[-1]) == (cut["save"], cut["file"]):
            whole = io.BytesIO()
            self.real_save(obj, whole, *args, **kwargs)
            data = whole.getvalue()
            with open(f, "wb") as out:
                out.write(data[:int(len(data) * cut["fraction"])])
            die(cut["killed_at"], cut.get("hold", False))
        if self.per_save:
            self.per_save[-1] += 1
        return self.real_save(obj, f, *args, **kwargs)

    def close(self):
        torch.save = self.real_save


def die(killed_at, hold=False):
    Path(killed_at).write_text(repr(time.time()))
    if hold:
        time.sleep(3600)
    os.kill(os.getpid(), signal.SIGKILL)


def kill_run(args):
    kill = json.loads(args.kill)
    engine = build(args.config, seed=INITIAL_SEED, reshard=True)
    if args.resume_latest:  # as a script that a restart starts again does
        engine.load_checkpoint(args.kill_run)
    resumed_at = engine.global_steps
    mine = kill["rank"] == dist.get_rank()

    def before(step, micro, phase):
        if mine and kill["where"] == "train" and (step, micro, phase) == (kill["step"], 0, kill["phase"]):
            die(args.killed_at, kill.get("hold", False))

    counter = SaveCounter(cut=dict(kill, killed_at=args.killed_at) if mine and kill["where"] == "save" else None)
    train_with_saves(engine, args.config, args.kill_run, before, counter.start)
    ended = {"resumed_at": resumed_at, "world_size": dist.get_world_size(), "weights": weights(engine)}
    if dist.get_rank() == 0:
        Path(args.finished).write_text(json.dumps(ended))


def uninterrupted(config, save_dir):

    def run():
        counter = SaveCounter()
        try:
            engine = build(config, seed=INITIAL_SEED, reshard=True)
            train_with_saves(engine, config, save_dir, on_save=counter.start)
        finally:
            counter.close()
        result = {"weights": weights(engine), "files_per_save": counter.per_save}
        engine.destroy()
        return result

    return run


def resume(config, save_dir):

    def run():
        engine = build(config, seed=INITIAL_SEED, reshard=True)
        loaded, _ = engine.load_checkpoint(save_dir)
        resumed = {"resumed_at": engine.global_steps, "loaded": loaded is not None, "state": state(engine)}
        train_with_saves(engine, config, save_dir)
        result = dict(resumed, weights=weights(engine), final_state=state(engine))
        engine.destroy()
        return result

    return run


def cases(args):
    chosen = {}
    for config in (name for name in args.configs.split(",") if name):
        chosen[f"uninterrupted/{config}"] = uninterrupted(config, str(Path(args.uninterrupted) / config))
    for spec in args.resume:
        label_config, path = spec.split("=", 1)
        label, config = label_config.split(":", 1)
        if config not in CONFIGS:
            raise SystemExit(f"--resume: unknown configuration {config}")
        chosen[f"resume-{label}/{config}"] = resume(config, path)
    return chosen


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--kill-run", help="train, save and be killed here (one trial)")
    parser.add_argument("--config", help="with --kill-run: the configuration")
    parser.add_argument("--kill", help="with --kill-run: where, as JSON")
    parser.add_argument("--killed-at", help="with --kill-run: the file the killed rank writes the time to")
    parser.add_argument("--finished",
                        help="with --kill-run: the file rank 0 writes when no kill came (JSON: the step it resumed "
                        "at, the world size, the weights)")
    parser.add_argument("--resume-latest",
                        action="store_true",
                        help="with --kill-run: load the newest checkpoint there first, if any")
    parser.add_argument("--uninterrupted", help="the uninterrupted runs save here")
    parser.add_argument("--configs", default="", help="with --uninterrupted: comma-separated configurations")
    parser.add_argument("--resume", action="append", default=[], help="LABEL:CONFIG=DIR: resume from DIR")
    args, _ = parser.parse_known_args()
    force_fp16_on_cpu()
    if args.kill_run:
        import deepspeed
        deepspeed.init_distributed()
        kill_run(args)
    else:
        run_cases(cases(args))
