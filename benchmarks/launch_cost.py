#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""What starting ranks costs the tests: a launch of ranks that import nothing, through the installed ``deepspeed``
launcher and through ``tools/toolkit/local_ranks.py`` (the tests' default), in turns.

The ranks are ``tests/workers/launch_probe.py`` (no torch), so the difference is what each way runs above them:
wall time and the CPU time of every process it started.

    python benchmarks/launch_cost.py [--nprocs 2] [--pairs 3]
"""

import argparse
import os
import resource
import tempfile
import time

from toolkit import REPO, tables
from toolkit.launch import deepspeed_command, local_ranks_command, run_launcher

PROBE = REPO / "tests" / "workers" / "launch_probe.py"
WAYS = {"deepspeed launcher": deepspeed_command, "tools/toolkit/local_ranks.py": local_ranks_command}


def children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_launch(launcher, nprocs):
    with tempfile.TemporaryDirectory(prefix="ds-launch-cost-") as out:
        wall, cpu = time.perf_counter(), children_cpu()
        run = run_launcher(PROBE, nprocs, ["--out", out, "--below", str(os.getpid())], timeout=300, launcher=launcher)
        if run.returncode != 0:
            raise SystemExit(f"launch failed:\n{run.tail()}")
        return time.perf_counter() - wall, children_cpu() - cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for pair in range(1, args.pairs + 1):
        for way, command in WAYS.items():
            wall, cpu = timed_launch(command(), args.nprocs)
            rows.append([str(pair), way, f"{wall:.1f}", f"{cpu:.1f}"])
    columns = ["pair", f"{args.nprocs} ranks started by", "wall, s", "CPU, s"]
    print("\n".join(tables.table(columns, rows, right=columns[2:])))


if __name__ == "__main__":
    main()
