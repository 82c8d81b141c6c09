# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""What the maintainers' tools and benchmarks share: the repository, the two sides (fork and pristine), venvs,
logged commands, file locks, free ports, pytest's outcomes, markdown tables and command-line options.

A script under tools/ has tools/ on ``sys.path`` already (Python puts a script's folder first); a benchmark or a
test puts it there once. Importing this package makes the build backend (``gafix_build``, at the repository's root)
reachable. The root is appended, never put first: it holds ``deepspeed/`` (the files the fork adds to upstream's
tree), which must never shadow the installed deepspeed a tool runs against. Nothing here imports from tests/.
"""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

if str(REPO) not in sys.path:
    sys.path.append(str(REPO))
