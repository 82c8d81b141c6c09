# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Our own Python files follow upstream's style: yapf (.style.yapf) and flake8 (.flake8)."""

import subprocess
import sys

import pytest

from helpers.repo import REPO, python_files

PYTHON_FILES = python_files()


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
    # --parallel: one file per core, about half the time on 2 cores.
    proc = run_tool("yapf", "--diff", "--parallel", *PYTHON_FILES)
    assert proc.returncode == 0, proc.stdout


def test_license_headers():
    for name in PYTHON_FILES:
        head = (REPO / name).read_text().splitlines()[:4]
        assert "# SPDX-License-Identifier: Apache-2.0" in head and "# DeepSpeed Team" in head, name
