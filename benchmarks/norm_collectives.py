#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Reducing collectives and host reads (``Tensor.item``) in one optimizer step, per engine path.

Runs tests/workers/global_grad_norm.py (2 CPU ranks, a 6-parameter model in 2 optimizer groups,
GAS 2) with the installed deepspeed and, with ``--pristine-python``, with pristine upstream in the
same run; prints both side by side. Counts are of the boundary ``engine.step()``, that is the norm and
the inf/nan check, and of the boundary ``backward()``, where the engine all-reduces the gradients
without ZeRO (ZeRO-1 does it in the step, ZeRO-2 in every backward, in both modes alike). Beside them
(the fork only) the same with ``"loss_normalization": "per_item"``: on ZeRO 1-3 the item count rides in
the norm's collective and comes back in its host read; without a ZeRO optimizer (stage 0,
BF16_Optimizer) it rides in the first gradient bucket's all-reduce, and the step reads it back once
(one host read more). The collectives are mean mode's on every path.

    python benchmarks/norm_collectives.py --pristine-python "$(tools/test-against-upstream --venv 0.19.8)"
"""

import argparse
import json
import subprocess
import tempfile

from toolkit import REPO, options, tables

CASES = [
    "zero0_fp32", "zero0_fp16", "zero0_fp16_fused_adam", "zero1_fp32", "zero2_fp32", "zero1_offload_fp32",
    "zero2_offload_fp32", "zero2_fp16", "zero1_bf16_fp32_accumulation", "zero2_bf16", "zero3_fp32",
    "zero3_offload_fp32"
]
# Every path above takes per_item (the worker's DATA_PARALLEL_PATHS).
PER_ITEM = CASES


def measure(extensions_dir):
    import deepspeed
    from toolkit.launch import launch_cases
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


def collectives(row):
    return f"{cell(row, 'collectives_in_boundary_step')} / {cell(row, 'collectives_in_boundary_backward')}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_sides(parser, fork=False, pristine_help="interpreter with pristine upstream deepspeed installed")
    options.add_extensions_dir(parser)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fork = measure(args.extensions_dir or tmp)
        if args.json:
            print(json.dumps(fork))
            return
        upstream = None
        if args.pristine_python:
            command = [args.pristine_python, __file__, "--json"]
            if args.extensions_dir:
                command += ["--extensions-dir", args.extensions_dir + "-upstream"]
            proc = subprocess.run(command, capture_output=True, text=True, check=True)
            upstream = json.loads(proc.stdout.strip().splitlines()[-1])
    header = f"fork: deepspeed {fork['deepspeed']}" + (f"; upstream: deepspeed {upstream['deepspeed']}"
                                                       if upstream else "")
    print(header + "\n")
    columns = [
        "path", "collectives in step / backward (fork)", "host reads in step (fork)",
        "per_item: collectives in step / backward, host reads in step (fork)"
    ]
    columns += ["collectives in step / backward (upstream)", "host reads in step (upstream)"] if upstream else []
    print("\n".join(tables.header(columns)))
    for case in CASES:
        row = fork["rows"][case]
        per_item = fork["rows"].get(f"{case}_per_item")
        line = f"| {case} | {collectives(row)} | {cell(row, 'host_reads_in_boundary_step')} | " + (
            f"{collectives(per_item)}, {cell(per_item, 'host_reads_in_boundary_step')}"
            if per_item else "refused (docs/guides/per_item_loss.md)") + " |"
        if upstream:
            up = upstream["rows"][case]
            line += f" {collectives(up)} | {cell(up, 'host_reads_in_boundary_step')} |"
        print(line)


if __name__ == "__main__":
    main()
