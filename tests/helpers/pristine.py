# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""An interpreter with pristine upstream deepspeed (the venv ``tools/test-against-upstream`` builds), on the
same torch and Python as the fork that runs the tests."""

import subprocess
import sys

from helpers.repo import REPO


def pristine_python():
    """Path of that venv's python, building the venv on first use (about a minute here; longer for a CUDA torch)."""
    proc = subprocess.run([str(REPO / "tools" / "test-against-upstream"), "--like", sys.executable, "--venv"],
                          stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE,
                          text=True,
                          timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"tools/test-against-upstream --venv failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc.stdout.strip().splitlines()[-1]
