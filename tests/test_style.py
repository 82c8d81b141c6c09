# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Our own Python files follow upstream's style: yapf (.style.yapf) and flake8 (.flake8)."""

import re
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


# The product's files describe the product, not how the work on it was organised: no numbered work periods,
# no account of which machine happened to be available, no status lines of the tools used to do the work.
NARRATION = [
    (re.compile(r"\bsessions? \d+", re.IGNORECASE), "a numbered work period"),
    (re.compile(r"\bsittings?\b", re.IGNORECASE), "a work period"),
    (re.compile(r"\blent\b", re.IGNORECASE), "which machine was lent"),
    (re.compile(r"\b(?:machines?|GPUs?|H100s?) (?:was|were|is|are) (?:not )?(?:available|drawn|lent)\b",
                re.IGNORECASE), "which machine was available"),
    (re.compile(r"\bnot drawn\b|\bdevice time left\b|\bbudget_left", re.IGNORECASE), "a tool's status line"),
    (re.compile(r"\bwork periods?\b|\bclosing notes?\b|\bstop \d+\b", re.IGNORECASE), "how the work was organised"),
]


def narration(text):
    """(line number, line, what) for each line of ``text`` that narrates how the work went."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for pattern, what in NARRATION:
            if pattern.search(line):
                found.append((number, line.strip(), what))
    return found


def is_text(name):
    data = (REPO / name).read_bytes()
    return b"\0" not in data[:8192]


def test_no_narration_of_how_the_work_was_organised():
    # This file holds the patterns and the seeded lines that show them caught.
    found = [
        f"{name}:{number}: {what}: {line[:160]}" for name in repo_files()
        if name != "tests/test_style.py" and is_text(name)
        for number, line, what in narration((REPO / name).read_text(errors="replace"))
    ]
    assert not found, "\n".join(found)


def test_narration_check_finds_each_pattern():
    seeded = [
        "Measured in session 17 on 2 cores.", "The runner sitting found a hang.", "No GPU machine was lent to us.",
        "An H100 was available that day.", "status: not drawn", "In the closing note of stop 24."
    ]
    assert [len(narration(line)) > 0 for line in seeded] == [True] * len(seeded)
    for line in ["@pytest.fixture(scope=\"session\")", "start_new_session=True", "the test session starts"]:
        assert narration(line) == [], line
