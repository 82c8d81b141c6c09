# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The repository under test, and scratch copies of it for tests that change build inputs."""

import importlib.machinery
import importlib.util
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def repo_files(root=REPO):
    """Files git would commit (tracked plus untracked, not ignored); without git, all but build outputs."""
    if (Path(root) / ".git").exists():
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=root,
                             check=True,
                             stdout=subprocess.PIPE).stdout.decode()
        return [name for name in out.split("\0") if name and (Path(root) / name).is_file()]
    skip = {"build", "dist", ".venv", "__pycache__", ".pytest_cache"}
    return [
        p.relative_to(root).as_posix() for p in Path(root).rglob("*")
        if p.is_file() and not skip & set(p.relative_to(root).parts)
    ]


def is_python(name, root=REPO):
    """A .py file, or an executable script of ours in Python (tools/gpu-check): its first line says so."""
    if name.endswith(".py"):
        return True
    if "." in name.rsplit("/", 1)[-1]:
        return False
    with open(Path(root) / name, "rb") as script:
        return script.readline().startswith(b"#!/usr/bin/env python")


def python_files(root=REPO):
    """Our Python files (repo_files' names), sorted."""
    return sorted(name for name in repo_files(root) if is_python(name, root))


def load_script(relative):
    """One of our scripts (benchmarks/step_time.py) as a module, to test its functions."""
    name = Path(relative).stem.replace("-", "_")
    loader = importlib.machinery.SourceFileLoader(name, str(REPO / relative))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader))
    loader.exec_module(module)
    return module


def copy_repo(dest):
    dest = Path(dest)
    for name in repo_files():
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target)
    return dest
