# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Rank worker for tests/test_launch.py (imports no torch): writes ``rank<RANK>.json`` in ``--out`` with what this
rank was started with (its environment, its interpreter's arguments, the processes above it up to ``--below``, each
with whether it loaded libtorch); with ``--fail-rank R``, rank R exits 3 once the others have written their pids,
and the others wait to be ended.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import psutil


def loads_torch(pid):
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return None


def above(below):
    """The processes between this rank and ``below`` (nearest first)."""
    found = []
    for process in psutil.Process().parents():
        if process.pid == below:
            return found
        found.append({"cmdline": process.cmdline(), "loads_torch": loads_torch(process.pid)})
    raise SystemExit(f"process {below} is not above this rank")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--below", type=int, required=True)
    parser.add_argument("--fail-rank", type=int)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    out = Path(args.out)
    if args.fail_rank is not None:
        if rank != args.fail_rank:
            (out / f"rank{rank}.pid").write_text(str(os.getpid()))
            time.sleep(300)
            return
        others = [out / f"rank{other}.pid" for other in range(int(os.environ["WORLD_SIZE"])) if other != rank]
        deadline = time.monotonic() + 60
        while not all(path.exists() for path in others) and time.monotonic() < deadline:
            time.sleep(0.05)
        sys.exit(3)
    record = {"env": dict(os.environ), "argv": sys.orig_argv[1:], "above": above(args.below)}
    (out / f"rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
