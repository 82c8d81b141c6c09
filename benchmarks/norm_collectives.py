#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Reducing collectives and host reads (``Tensor.item``) in one optimizer step, per engine path.

Runs tests/workers/global_grad_norm.py (2 CPU ranks, a 6-parameter model in 2 optimizer groups,
GAS 2) with the installed deepspeed and, with ``--upstream-python``, with pristine upstream in the
same run; prints both side by side. Counts are of the boundary ``engine.step()``: gradient
reduction happens in backward, so these are the norm and the inf/nan check. Beside them (the fork
only) the same step with ``"loss_normalization": "per_item"``: on ZeRO 1-3 the item count rides in the
norm's collective and comes back in its host read (counts equal to mean mode's); without a ZeRO
optimizer (stage 0, BF16_Optimizer) the count takes one small all-reduce in the boundary backward,
before the gradients', and the step reads it back once (one host read more).

    python benchmarks/norm_collectives.py --upstream-python build/upstream-venv-0.19.8/bin/python
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

CASES = [
    "zero0_fp32", "zero0_fp16", "zero0_fp16_fused_adam", "zero1_fp32", "zero2_fp32", "zero1_offload_fp32",
    "zero2_offload_fp32", "zero2_fp16", "zero1_bf16_fp32_accumulation", "zero2_bf16", "zero3_fp32",
    "zero3_offload_fp32"
]
# Every path above takes per_item (the worker's DATA_PARALLEL_PATHS).
PER_ITEM = CASES


def measure(extensions_dir):
    import deepspeed
    from helpers.launch import launch_cases
    # Pristine DeepSpeed has no per_item mode.
    cases = CASES + ([f"{case}_per_item" for case in PER_ITEM] if "gafix" in deepspeed.__version__ else [])
    result = launch_cases(REPO / "tests" / "workers" / "global_grad_norm.py",
                          nprocs=2,
                          cases=cases,
                          extensions_dir=extensions_dir,
                          timeout=900)
    rows = {}
    for case in cases:
        value = result.ranks[0][case]
        rows[case] = value["value"] if value["ok"] else {"error": value["error"].strip().splitlines()[-1]}
    return {"deepspeed": deepspeed.__version__, "rows": rows}


def cell(row, key):
    return str(row[key]) if key in row else "error"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream-python", help="interpreter with pristine upstream deepspeed installed")
    parser.add_argument("--extensions-dir", help="TORCH_EXTENSIONS_DIR to reuse (default: a fresh one)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fork = measure(args.extensions_dir or tmp)
        if args.json:
            print(json.dumps(fork))
            return
        upstream = None
        if args.upstream_python:
            command = [args.upstream_python, __file__, "--json"]
            if args.extensions_dir:
                command += ["--extensions-dir", args.extensions_dir + "-upstream"]
            proc = subprocess.run(command, capture_output=True, text=True, check=True)
            upstream = json.loads(proc.stdout.strip().splitlines()[-1])
    header = f"fork: deepspeed {fork['deepspeed']}" + (f"; upstream: deepspeed {upstream['deepspeed']}"
                                                       if upstream else "")
    print(header + "\n")
    print("| path | collectives (fork) | host reads (fork) | per_item: collectives / host reads (fork) |" +
          (" collectives (upstream) | host reads (upstream) |" if upstream else ""))
    print("|---|---|---|---|" + ("---|---|" if upstream else ""))
    for case in CASES:
        row = fork["rows"][case]
        per_item = fork["rows"].get(f"{case}_per_item")
        line = (f"| {case} | {cell(row, 'collectives_in_boundary_step')} | "
                f"{cell(row, 'host_reads_in_boundary_step')} | " +
                (f"{cell(per_item, 'collectives_in_boundary_step')} / {cell(per_item, 'host_reads_in_boundary_step')}"
                 if per_item else "refused (docs/per_item_loss.md)") + " |")
        if upstream:
            up = upstream["rows"][case]
            line += f" {cell(up, 'collectives_in_boundary_step')} | {cell(up, 'host_reads_in_boundary_step')} |"
        print(line)


if __name__ == "__main__":
    main()
