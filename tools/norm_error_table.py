#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Print, as a Markdown table, the grad norm and update errors against fp64 of a norm worker's engine
paths, on the fork and on pristine upstream side by side (docs/evidence/grad_norm.md's MoE table).

The worker (tests/workers/moe_norm.py, or moe_tp_norm.py with ``--worker moe_tp``) reports per case and rank ``norm``, ``reference_norm``,
``update_error`` and ``collectives_in_boundary_step``; case names are ``<path>_m<micro>_g<gas>``. Each
cell is the largest error over the splits and ranks (collectives: every value seen).

    tools/norm_error_table.py --pristine-python "$(tools/test-against-upstream --venv 0.19.8)"
"""

import argparse
import os
from pathlib import Path

from toolkit import REPO, options, tables
from toolkit.launch import launch_cases, local_ranks_command

WORKERS = {
    "moe": REPO / "tests" / "workers" / "moe_norm.py",
    # case names <layout>_<path>_m<micro>_g<gas>: a row per layout and path
    "moe_tp": REPO / "tests" / "workers" / "moe_tp_norm.py",
}


def summarise(launched):
    """path -> {"norm": worst relative error (None: a rank reported no norm), "update": worst or None,
    "collectives": sorted set}."""
    rows = {}
    for rank_results in launched.ranks:
        for name, outcome in rank_results.items():
            path = name.rsplit("_m", 1)[0]
            if not outcome["ok"]:
                raise SystemExit(f"case {name} failed: {outcome['error'][-1500:]}")
            result = outcome["value"]
            row = rows.setdefault(path, {"norm": 0.0, "update": None, "collectives": set()})
            if result["norm"] is None or row["norm"] is None:
                row["norm"] = None
            else:
                error = abs(result["norm"] - result["reference_norm"]) / result["reference_norm"]
                row["norm"] = max(row["norm"], error)
            if result["update_error"] is not None:
                row["update"] = max(row["update"] or 0.0, result["update_error"])
            row["collectives"].add(result["collectives_in_boundary_step"])
    return rows


def figure(value):
    return "None" if value is None else f"{value:.2g}"


def table(sides):
    names = list(sides)
    header = ["path"] + [f"{what}, {side}" for what in ("norm error", "update error", "collectives") for side in names]
    lines = [*tables.header(header)]
    for path in sides[names[0]]:
        rows = [sides[side][path] for side in names]
        cells = [figure(r["norm"])
                 for r in rows] + [figure(r["update"]) if r["update"] is not None else "-" for r in rows]
        cells += ["/".join(str(c) for c in sorted(r["collectives"])) for r in rows]
        lines.append("| " + " | ".join([path] + cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", choices=sorted(WORKERS), default="moe")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    options.add_sides(parser, fork=False)
    options.add_extensions_dir(parser, per_side=True)
    args = parser.parse_args(argv)

    launchers = {"fork": None}
    if args.pristine_python:
        launchers["pristine"] = local_ranks_command(os.path.abspath(args.pristine_python))
    for ranks in args.ranks:
        sides = {}
        for side, launcher in launchers.items():
            extensions = Path(args.extensions_dir) / side if args.extensions_dir else None
            launched = launch_cases(WORKERS[args.worker],
                                    nprocs=ranks,
                                    timeout=1800,
                                    extensions_dir=extensions,
                                    launcher=launcher)
            sides[side] = summarise(launched)
        print(f"\n{ranks} ranks\n\n{table(sides)}")


if __name__ == "__main__":
    main()
