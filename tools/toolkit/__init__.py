# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""What the maintainers' tools and benchmarks share: the repository, the two sides (fork and pristine), venvs,
logged commands, file locks, free ports, pytest's outcomes, markdown tables and command-line options.

A script under tools/ has tools/ on ``sys.path`` already (Python puts a script's folder first); a benchmark or a
test puts it there once. Importing this package makes the repository's other import roots reachable: the build
backend (``gafix_build``) and the tests' helpers (``helpers``, tests/helpers). They are appended, never put first:
the repository holds ``deepspeed/`` (the files the fork adds to upstream's tree), which must never shadow the
installed deepspeed a tool runs against.
"""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

for _root in (REPO, REPO / "tests"):
    if str(_root) not in sys.path:
        sys.path.append(str(_root))
