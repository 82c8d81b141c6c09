#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""docs/evidence/upstream_coverage.md: which of upstream's own tests run each patch's changed code, from
patches/facts.toml (its ``[[upstream_tests]]`` and each patch's ``uncovered``).

    tools/upstream_coverage.py            write the page
    tools/upstream_coverage.py --check    exit 1 when the committed page differs from what the facts say
"""

import argparse
import sys

from toolkit import REPO
from upstream_suite import tiers

PAGE = REPO / "docs" / "evidence" / "upstream_coverage.md"
INTRO = """# Which of upstream's tests run each patch

Each patch of the series, by name, and the upstream test files that run its changed lines on a CPU: CI's patch
tier runs the first ones; the full tier runs those marked *full tier only* (they are too slow for CI, and why is
given). Where no upstream test reaches a patch's lines on a CPU, the row says why; the patch's own upstream-style
test covers it ([patch tests](patch_tests.md)). Written from `patches/facts.toml` by `tools/upstream_coverage.py`;
results of both tiers: [upstream's own tests](upstream_suite.md).
"""


def page():
    return f"{INTRO}\n{tiers.patch_table()}\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    if args.check:
        if PAGE.read_text() != page():
            print(f"{PAGE.relative_to(REPO)} is out of date: run tools/upstream_coverage.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(page())
    print(f"wrote {PAGE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
