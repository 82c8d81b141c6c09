# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""One run at a time in a work directory.

A run lays its scratch copies of the tests (``tree-<side>``) in the work directory, rebuilds them when
what they hold changes (a new patch test, another package), and runs pytest inside them. A second run in
the same directory (a resume started twice, or a report started while a tier runs) could delete a tree
under the first one's running tests: they then fail with ``FileNotFoundError`` from ``os.getcwd()``, on
one side only, and read as regressions. ``--report-only`` reads the results and touches no tree, so it
needs no lock.
"""

import os
from contextlib import ExitStack, contextmanager
from pathlib import Path

from toolkit import locks

LOCK_NAME = "run.lock"


class WorkDirBusy(Exception):
    """Another run holds the work directory."""


@contextmanager
def hold(work_dir):
    """Hold ``work_dir`` for this run (released when the process ends, however it ends)."""
    with ExitStack() as held:
        try:
            held.enter_context(
                locks.exclusive(Path(work_dir) / LOCK_NAME, wait=False,
                                holder=f"run-upstream-suite pid {os.getpid()}"))
        except locks.Held as busy:  # taking the lock only: the run's own errors pass as they are
            raise WorkDirBusy(
                f"{busy.holder} is running in {work_dir} (its scratch trees are in use): wait for it, "
                "pass another --work-dir, or --report-only (reads the results, touches no tree)") from None
        yield
