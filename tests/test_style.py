# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Our own Python files follow upstream's style: yapf (.style.yapf) and flake8 (.flake8)."""

import subprocess
import sys

import pytest

from helpers.repo import REPO, repo_files


def is_python(name):
    """A .py file, or an executable script of ours in Python (tools/gpu-check): its first line says so."""
    if name.endswith(".py"):
        return True
    if "." in name.rsplit("/", 1)[-1]:
        return False
    with open(REPO / name, "rb") as script:
        return script.readline().startswith(b"#!/usr/bin/env python")


PYTHON_FILES = sorted(name for name in repo_files() if is_python(name))


def run_tool(module, *args):
    pytest.importorskip(module)
    return subprocess.run([sys.executable, "-m", module, *args],
                          cwd=REPO,
                          stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT,
                          text=True)


def test_flake8():
    proc = run_tool("flake8", *PYTHON_FILES)
    assert proc.returncode == 0, proc.stdout


def test_yapf():
    proc = run_tool("yapf", "--diff", *PYTHON_FILES)
    assert proc.returncode == 0, proc.stdout


def test_license_headers():
    for name in PYTHON_FILES:
        head = (REPO / name).read_text().splitlines()[:4]
        assert "# SPDX-License-Identifier: Apache-2.0" in head and "# DeepSpeed Team" in head, name
