# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""An exclusive lock on a file, held by one process at a time and released when it ends, however it ends (flock):
what the tools take before they build or rebuild something another run may be using."""

import fcntl
from contextlib import contextmanager
from pathlib import Path


class Held(Exception):
    """Another process holds the lock; ``holder`` is what it wrote there (or ``"a process"``)."""

    def __init__(self, holder):
        super().__init__(holder)
        self.holder = holder


@contextmanager
def exclusive(path, wait=True, holder=None):
    """Hold the lock file ``path`` (made, with its folder, if missing). ``wait``: wait for another holder to let go;
    else raise ``Held``. ``holder``: what to write there while held, for a refused process to name."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            handle.seek(0)
            raise Held(handle.read().strip() or "a process") from None
        if holder:
            handle.seek(0)
            handle.truncate()
            handle.write(holder)
            handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
