# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The two sides every comparison runs: the fork (the interpreter running, or one given) and pristine upstream."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


class PristineNotFound(RuntimeError):
    """tools/test-against-upstream could not give a pristine interpreter."""


def pristine_python(given=None, fork_python=None, timeout=1800):
    """The pristine interpreter: ``given``, else the venv tools/test-against-upstream builds (or has built) for
    pristine upstream on ``fork_python``'s torch and Python (default: this interpreter's); about a minute the first
    time, longer for a CUDA torch."""
    if given:
        return given
    proc = subprocess.run(
        [str(REPO / "tools" / "test-against-upstream"), "--like", fork_python or sys.executable, "--venv"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        timeout=timeout)
    if proc.returncode != 0:
        raise PristineNotFound(f"tools/test-against-upstream --venv failed ({proc.returncode}): "
                               f"{proc.stderr.strip()[-2000:]}")
    return proc.stdout.strip().splitlines()[-1]


def clean_environ(**overrides):
    """This process's environment for a side's subprocess, without PYTHONPATH (each side's interpreter imports its
    own deepspeed, never one a path puts first), with ``overrides``."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(overrides)
    return env
