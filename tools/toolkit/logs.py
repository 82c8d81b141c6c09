# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Running a command into a log file, as the long tiers do (pip installs, builds, test runs)."""

import subprocess
import time


def run_logged(cmd, log, env=None, cwd=None, timeout=None):
    """Run ``cmd`` with its output appended to ``log`` after a ``$ cmd`` line; ``(returncode, seconds)``."""
    cmd = [str(part) for part in cmd]
    started = time.time()
    with open(log, "a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, timeout=timeout)
    return proc.returncode, time.time() - started
