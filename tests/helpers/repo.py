# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The repository under test, and scratch copies of it for tests that change build inputs."""

import importlib.machinery
import importlib.util
import shutil
import sys
from pathlib import Path

from toolkit.files import repo_files  # noqa: F401 (the tests name it from here)

REPO = Path(__file__).resolve().parents[2]


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
    """One of our scripts (benchmarks/step_time.py, examples/gas_demo.py) as a module, to test or use its functions;
    registered under its name, so that what it defines pickles and copies as a module's would."""
    name = Path(relative).stem.replace("-", "_")
    loader = importlib.machinery.SourceFileLoader(name, str(REPO / relative))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader))
    sys.modules[name] = module
    loader.exec_module(module)
    return module


def copy_repo(dest):
    dest = Path(dest)
    for name in repo_files():
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target)
    return dest
