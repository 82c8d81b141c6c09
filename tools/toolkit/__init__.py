# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""What the maintainers' tools and benchmarks share: the repository, the two sides (fork and pristine), venvs,
logged commands, file locks, free ports, pytest's outcomes, markdown tables and command-line options.

Installed editable (tools/pyproject.toml: ``pip install -e tools``, part of README's test command) into every
environment that runs the tools, the tests or the benchmarks, with the build backend (``gafix_build``) beside it; the
repository's root is never put on ``sys.path``: its ``deepspeed/`` (the files the fork adds to upstream's tree) would
shadow the installed deepspeed a tool runs against. Nothing here imports from tests/.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
