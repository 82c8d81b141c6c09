# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Where CI's time goes: seconds per test module from the JUnit XML a run wrote, costliest first.

    tools/ci-time                      # build/ci-junit.xml, the one .ci/run writes
    tools/ci-time other.xml --most 10

A module's first test carries its module-scoped launches (pytest counts a fixture's setup in the test that
first needs it), so a module's sum is what leaving it out of CI would save.
"""

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from toolkit import REPO, junit, tables

DEFAULT_XML = REPO / "build" / "ci-junit.xml"


def per_module(cases):
    """(module, seconds, tests run, tests skipped) per module, costliest first."""
    seconds, ran, skipped = defaultdict(float), defaultdict(int), defaultdict(int)
    for case in cases:
        module = case.module
        seconds[module] += case.seconds
        if case.outcome == "skipped":
            skipped[module] += 1
        else:
            ran[module] += 1
    return sorted(((module, seconds[module], ran[module], skipped[module]) for module in seconds),
                  key=lambda row: (-row[1], row[0]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("xml", nargs="?", type=Path, default=DEFAULT_XML)
    parser.add_argument("--most", type=int, default=0, help="only the costliest N modules (default: all)")
    args = parser.parse_args(argv)
    if not args.xml.is_file():
        print(f"ci-time: no JUnit XML at {args.xml} (.ci/run writes build/ci-junit.xml)", file=sys.stderr)
        return 2
    rows = per_module(junit.cases(args.xml))
    total = sum(row[1] for row in rows)
    shown = rows[:args.most] if args.most > 0 else rows
    print("\n".join(
        tables.table(["module", "seconds", "share", "run", "skipped"],
                     [(module, f"{seconds:.0f}", f"{seconds / total:.0%}" if total else "-", ran, skipped)
                      for module, seconds, ran, skipped in shown],
                     right=("seconds", "share", "run", "skipped"))))
    print(f"\n{len(rows)} modules, {total:.0f} s in all")
    return 0
