#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Print the Hugging Face Trainer matrix of the installed transformers/accelerate/deepspeed as Markdown.

Runs tests/workers/hf_trainer.py (the grid of tests/test_hf_trainer.py: one launch on 1 rank, one on
2) with the python that runs this script (the active venv's), so the same command judges any installed combination
(a venv with the maintainers' layer installed: ``pip install -e tools``):

    tools/hf_matrix.py          # the fork + the pinned transformers/accelerate; in another venv, e.g. transformers
                                # 5.3.0 + deepspeed 0.18.9, the same command with that venv active

Each cell is PASS, or the applied gradient's factor against the fp64 reference at step 1 / step 2,
or "= reference, != none" when it is right but the same split without DeepSpeed is not, or the first
other mismatch (logged loss or grad_norm). Exit status 1 when a cell fails.
"""

import argparse
import importlib.metadata
import sys
import tempfile

from toolkit import REPO, options, tables
from toolkit.launch import launch_cases
from hf_training import cases
from hf_training.trainer_run import BACKENDS
from hf_training.verdict import TOLERANCE, problems


def cell(case, outcomes):
    """outcomes: one per rank (a dict), or the error text of a case that raised."""
    if isinstance(outcomes, str):
        return f"error: {outcomes}"
    for outcome in outcomes:
        found = problems(case, outcome)
        if not found:
            continue
        if any(err > TOLERANCE for err in outcome["rel_error"]):
            return "x" + " / x".join(f"{factor:.3g}" for factor in outcome["factor"])
        others = [problem for problem in found if "without DeepSpeed" not in problem]
        # Right against the reference, but the run without DeepSpeed was not: say which side is wrong.
        return others[0][:80] if others else "FAIL: = reference, != none"
    return "PASS"


def outcomes_of(result, name):
    values = []
    for rank_cases in result.ranks:
        entry = rank_cases.get(name)
        if entry is None:
            return "not run"
        if not entry["ok"]:
            return entry["error"].strip().splitlines()[-1][:80]
        values.append(entry["value"])
    return values


def table(world_size, result):
    lines = [
        *tables.header(["ranks", "model", "rows", "loss kwargs", "split", *BACKENDS]),
    ]
    failed = 0
    rows = {}
    for case in cases.grid(world_size):
        key = (case.model, case.padding, case.loss_kwargs, case.split)
        rows.setdefault(key, {})[case.backend] = cell(case, outcomes_of(result, case.name))
    for (model, padding, loss_kwargs, split), cells in rows.items():
        failed += sum(value != "PASS" for value in cells.values())
        lines.append(f"| {world_size} | {model} | {padding} | {loss_kwargs} | {split} | " +
                     " | ".join(cells[backend] for backend in BACKENDS) + " |")
    return lines, failed


def norms(world_size, result):
    """Applied-gradient norm at step 1 and 2 vs the reference's, for each case."""
    lines = [*tables.header(["ranks", "case", "applied norm step 1, 2", "reference step 1, 2"])]
    for case in cases.grid(world_size):
        outcomes = outcomes_of(result, case.name)
        if isinstance(outcomes, str):
            lines.append(f"| {world_size} | {case.name} | error: {outcomes} | |")
            continue
        got = ", ".join(f"{value:.6f}" for value in outcomes[0]["applied_norm"])
        want = ", ".join(f"{value:.6f}" for value in outcomes[0]["reference_norm"])
        lines.append(f"| {world_size} | {case.name} | {got} | {want} |")
    return lines


def versions():
    found = []
    for name in ("deepspeed", "transformers", "accelerate", "torch"):
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name} (not installed)")
    return ", ".join(found)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_extensions_dir(parser)
    parser.add_argument("--ranks", type=int, nargs="+", default=sorted(cases.SPLITS), choices=sorted(cases.SPLITS))
    parser.add_argument("--norms", action="store_true", help="also print every case's applied-gradient norms")
    args = parser.parse_args()
    print(f"{versions()}; CPU, fp32, SGD, 2 steps; tolerance {TOLERANCE:g} relative\n")
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for world_size in args.ranks:
            result = launch_cases(REPO / "tests" / "workers" / "hf_trainer.py",
                                  nprocs=world_size,
                                  extensions_dir=args.extensions_dir or tmp,
                                  timeout=1800,
                                  extra_args=["--world-size", str(world_size)])
            lines, world_failed = table(world_size, result)
            failed += world_failed
            print("\n".join(lines) + "\n")
            if args.norms:
                print("\n".join(norms(world_size, result)) + "\n")
    print(f"{failed} failing cell(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
