# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The repository's own files: what git would commit."""

import subprocess
from pathlib import Path

from toolkit import REPO

BUILD_OUTPUTS = {"build", "dist", ".venv", "__pycache__", ".pytest_cache"}


def repo_files(root=REPO):
    """Files git would commit (tracked plus untracked, not ignored), relative names; without git (a copy of the
    repository), every file but build outputs."""
    root = Path(root)
    if (root / ".git").exists():
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=root,
                             check=True,
                             stdout=subprocess.PIPE).stdout.decode()
        return [name for name in out.split("\0") if name and (root / name).is_file()]
    return [
        p.relative_to(root).as_posix() for p in root.rglob("*")
        if p.is_file() and not BUILD_OUTPUTS & set(p.relative_to(root).parts)
    ]
