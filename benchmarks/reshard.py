#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""What a resume on another number of ranks costs: ``engine.load_checkpoint`` of a ZeRO-2 checkpoint (a GPT-like
model, fp32, AdamW) saved on W ranks and loaded on R with ``"checkpoint": {"reshard_on_load": true}``, beside the
plain load on W ranks and beside torch.distributed.checkpoint (FSDP2, the same model and move). Every run goes through
the installed ``deepspeed`` launcher; ``--before-python`` adds the same loads by another install (one that reshards
through the universal format) for a before/after table.

    python benchmarks/reshard.py [--sizes 20M,110M,336M] [--moves 2:1,1:2] [--before-python PATH] [--no-dcp]

Per load: seconds (the slowest rank's), rank 0's resident memory before the load and at its peak during it, and what
the load left on disk beside the checkpoint.
"""

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from toolkit import REPO, tables
from toolkit.launch import deepspeed_command, run_launcher

WORKER = REPO / "benchmarks" / "reshard_worker.py"
GIB = 2**30


def disk_bytes(directory):
    return sum(path.stat().st_size for path in Path(directory).rglob("*") if path.is_file())


class Runs:

    def __init__(self, root, before_python, pg_timeout=None):
        self.root = Path(root)
        self.pg_timeout = pg_timeout
        self.launchers = {"after": deepspeed_command()}
        if before_python:
            self.launchers["before"] = deepspeed_command(str(Path(before_python).parent / "deepspeed"))

    def launch(self, ranks, args, side="after", may_fail=False):
        """What each rank reported; None for a load that failed where ``may_fail``."""
        with tempfile.TemporaryDirectory(dir=self.root) as out:
            run = run_launcher(WORKER, ranks, [*args, "--out", out], timeout=3600, launcher=self.launchers[side])
            if run.returncode != 0:
                if may_fail:
                    return None
                raise SystemExit(f"{side} {' '.join(args)} on {ranks} ranks failed:\n{run.tail()}")
            return [json.loads(path.read_text()) for path in sorted(Path(out).glob("rank*.json"))]

    def saved(self, size, ranks, dcp):
        checkpoint = self.root / f"{'dcp' if dcp else 'ds'}_{size}_ws{ranks}"
        if not checkpoint.exists():
            self.launch(ranks,
                        ["--size", size, "--checkpoint", str(checkpoint), "--save"] + (["--dcp"] if dcp else []))
        return checkpoint

    def load(self, size, saved_on, ranks, dcp=False, side="after"):
        checkpoint = self.saved(size, saved_on, dcp)
        shutil.rmtree(checkpoint / "t_universal", ignore_errors=True)  # an earlier conversion would be reused
        before = disk_bytes(checkpoint)
        options = (["--dcp"] if dcp else []) + (["--pg-timeout", str(self.pg_timeout)] if self.pg_timeout else [])
        reports = self.launch(ranks, ["--size", size, "--checkpoint", str(checkpoint)] + options,
                              side,
                              may_fail=self.pg_timeout is not None)
        left = disk_bytes(checkpoint) - before
        shutil.rmtree(checkpoint / "t_universal", ignore_errors=True)
        shutil.rmtree(checkpoint / ".t_universal.partial", ignore_errors=True)
        if reports is None:
            return {"seconds": None, "rss_before": 0, "rss_peak": 0, "disk_left": left}
        return {
            "seconds": max(report["seconds"] for report in reports),
            "rss_before": reports[0]["rss_before"],
            "rss_peak": reports[0]["rss_peak"],
            "disk_left": left
        }


def row(entry, base):
    if entry["seconds"] is None:
        return [entry["size"], entry["move"], entry["way"], "failed", "", "", f"{entry['disk_left'] / GIB:.2f}"]
    return [
        entry["size"], entry["move"], entry["way"], f"{entry['seconds']:.2f}", f"{entry['seconds'] / base:.2f}",
        f"{entry['rss_before'] / GIB:.2f} -> {entry['rss_peak'] / GIB:.2f}", f"{entry['disk_left'] / GIB:.2f}"
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="20M,110M,336M")
    parser.add_argument("--moves", default="2:1,1:2")
    parser.add_argument("--before-python", help="an install that reshards through the universal format")
    parser.add_argument("--no-dcp", action="store_true")
    parser.add_argument("--pg-timeout",
                        type=float,
                        help="the ranks' process-group timeout, seconds (a failed load "
                        "is then reported as such)")
    parser.add_argument("--json", help="write the measurements here too")
    args = parser.parse_args()
    moves = [tuple(int(n) for n in move.split(":")) for move in args.moves.split(",")]
    ways = [("DeepSpeed, resharded as it loads", dict(side="after"))]
    if args.before_python:
        ways.append(("DeepSpeed, through the universal format", dict(side="before")))
    if not args.no_dcp:
        ways.append(("torch.distributed.checkpoint (FSDP2)", dict(dcp=True)))
    rows, measured = [], []
    with tempfile.TemporaryDirectory(prefix="ds-reshard-") as root:
        runs = Runs(root, args.before_python, args.pg_timeout)
        for size in args.sizes.split(","):
            plain = {}
            for saved_on, ranks in moves:
                # The load on the ranks that saved (the ratios' reference), and on the new ranks from a checkpoint
                # they saved themselves (the memory a load on them takes anyway).
                for world in (saved_on, ranks):
                    if world not in plain:
                        plain[world] = dict(size=size,
                                            move=f"{world} -> {world}",
                                            way="DeepSpeed, same ranks",
                                            **runs.load(size, world, world))
                        measured.append(plain[world])
                        rows.append(row(plain[world], plain[world]["seconds"]))
                for way, options in ways:
                    entry = dict(size=size,
                                 move=f"{saved_on} -> {ranks}",
                                 way=way,
                                 **runs.load(size, saved_on, ranks, **options))
                    measured.append(entry)
                    rows.append(row(entry, plain[saved_on]["seconds"]))
    print("\n".join(
        tables.table(
            ["model", "ranks", "load", "seconds", "/ same ranks", "rank 0 memory (GiB)", "left on disk (GiB)"],
            rows,
            right=("seconds", "/ same ranks"))))
    if args.json:
        Path(args.json).write_text(json.dumps(measured, indent=1) + "\n")


if __name__ == "__main__":
    main()
