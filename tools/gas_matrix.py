#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Print the GAS-invariance matrix of the installed deepspeed as a Markdown table.

Runs tests/workers/gas_checker.py (every engine path of tests/test_gas_check.py, one 2-rank launch)
with the python that runs this script, so the same command gives the fork's matrix and, from
another environment, pristine upstream's:

    tools/gas_matrix.py                                        # the installed fork
    "$(tools/test-against-upstream --venv 0.19.8)" tools/gas_matrix.py         # after tools/test-against-upstream
    tools/gas_matrix.py --parallel                             # MoE, Ulysses SP, AutoTP rows instead
    tools/gas_matrix.py --parallel --rows moe_tp2              # only the MoE-under-TP rows
"""

import argparse
import tempfile

from toolkit import REPO, options, tables
from toolkit.launch import launch_cases
import parallel_matrix


def cell(row):
    """PASS, or FAIL with the step-1 update's factor, the reported norm's, or "step>1" when step 1 was right."""
    if row["passed"]:
        return "PASS"
    update, norm = row["update_factor"], row["norm_factor"]
    if abs(update - 1) > 0.01:
        return f"FAIL x{update:.3g}"
    if norm == norm and abs(norm - 1) > 0.01:
        return f"FAIL norm x{norm:.3g}"
    return "FAIL step>1"


def first_diagnosis(rows):
    for row in rows:
        if row["diagnosis"]:
            return f"{row['name']}: {row['diagnosis'][0]}"
    return ""


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_extensions_dir(parser)
    parser.add_argument(
        "--parallel",
        action="store_true",
        help="the MoE, Ulysses SP, AutoTP and MoE-under-TP rows (tools/parallel_matrix.py), not the engine paths")
    parser.add_argument("--rows",
                        nargs="+",
                        choices=[prefix for prefix, _, _ in parallel_matrix.WORKERS],
                        help="with --parallel: only these workers' rows (default: all)")
    args = parser.parse_args()
    import deepspeed
    if args.parallel:
        return print_parallel(args.extensions_dir, deepspeed.__version__, args.rows)
    with tempfile.TemporaryDirectory() as tmp:
        result = launch_cases(REPO / "tests" / "workers" / "gas_checker.py",
                              nprocs=2,
                              extensions_dir=args.extensions_dir or tmp,
                              timeout=1800)
    print(f"deepspeed {deepspeed.__version__}, 2 CPU ranks, per-rank micro-batch x GAS splits\n")
    splits = None
    lines = []
    for case, outcome in result.ranks[0].items():
        if not outcome["ok"]:
            lines.append(f"| {case} | error: {outcome['error'].strip().splitlines()[-1][:100]} |")
            continue
        rows = outcome["value"]
        splits = splits or [r["name"] for r in rows]
        lines.append(f"| {case} | " + " | ".join(cell(r) for r in rows) + f" | {first_diagnosis(rows)} |")
    header = ["case"] + [s.rsplit(" x ", 1)[0] for s in (splits or [])] + ["first diagnosis"]
    print("\n".join(tables.header(header)))
    print("\n".join(lines))


def print_parallel(extensions_dir, version, only=None):
    print(f"deepspeed {version}, 2 CPU ranks, splits of one global batch of 8 samples\n")
    with tempfile.TemporaryDirectory() as tmp:
        for prefix, worker, what in parallel_matrix.WORKERS:
            if only and prefix not in only:
                continue
            result = launch_cases(parallel_matrix.WORKERS_DIR / worker,
                                  nprocs=2,
                                  extensions_dir=extensions_dir or tmp,
                                  timeout=1800)
            table, splits = parallel_matrix.rows(prefix, result.ranks)
            print(parallel_matrix.markdown(what, table, splits, version) + "\n", flush=True)


if __name__ == "__main__":
    main()
