#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""What a first run costs: the JIT builds of the ops a CPU training step loads, fork vs pristine.

Each op is loaded in a fresh process with a fresh, empty TORCH_EXTENSIONS_DIR (its build time), then
again with the same directory (the cached load every later run pays; both include starting Python
and importing deepspeed, so their difference is the build's cost). On the CPU accelerator a step
loads the shm comm op (both installs) and, on the fork, fused_norm; CPU Adam (optimizer offload)
and FusedAdam's CPU op are listed for reference. ``--ops`` picks.

    python benchmarks/first_use.py --pristine-python "$(tools/test-against-upstream --venv 0.19.8)"
"""

import argparse
import json
import subprocess
import tempfile
import time

from toolkit import options, tables
from toolkit.sides import pristine_python

LOADS = {
    "shm_comm": "from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder as B; B().load()",
    "fused_norm": "from deepspeed.ops.fused_norm import load_op; assert load_op() is not None",
    "cpu_adam": "from deepspeed.ops.op_builder.cpu import CPUAdamBuilder as B; B().load()",
}


def timed_load(python, code, extensions_dir):
    env_code = f"import os; os.environ['TORCH_EXTENSIONS_DIR'] = {extensions_dir!r}; {code}"
    start = time.perf_counter()
    proc = subprocess.run([python, "-c", env_code], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return {"seconds": seconds}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_sides(parser)
    parser.add_argument("--ops", nargs="+", default=["shm_comm", "fused_norm"], choices=sorted(LOADS))
    parser.add_argument("--json")
    args = parser.parse_args()
    args.pristine_python = pristine_python(args.pristine_python, args.fork_python)
    rows = []
    for side, python in (("fork", args.fork_python), ("pristine", args.pristine_python)):
        for op in args.ops:
            if op == "fused_norm" and side == "pristine":
                continue  # upstream has no such op
            with tempfile.TemporaryDirectory(prefix="ds-first-use-") as fresh:
                first = timed_load(python, LOADS[op], fresh)
                cached = timed_load(python, LOADS[op], fresh)
            rows.append({"side": side, "op": op, "first": first, "cached": cached})
    columns = ["side", "op", "first load (JIT build), s", "cached load, s", "the build's cost, s"]
    print("\n".join(tables.header(columns, right=columns[2:])))
    cell = lambda r: f"{r['seconds']:.1f}" if "seconds" in r else r["error"]
    for row in rows:
        first, cached = row["first"], row["cached"]
        cost = f"{first['seconds'] - cached['seconds']:.1f}" if "seconds" in first and "seconds" in cached else "-"
        print(f"| {row['side']} | {row['op']} | {cell(first)} | {cell(cached)} | {cost} |")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)


if __name__ == "__main__":
    main()
