# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Progress of a long check on stderr (rank 0): what runs, step k/n, elapsed time."""

import sys
import time


class Progress:
    """One line per split: rewritten in place on a terminal, one line per step in a log."""

    def __init__(self, total_splits, stream=None, enabled=True):
        self.total = total_splits
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.started = time.monotonic()
        self.tty = self.enabled and hasattr(self.stream, "isatty") and self.stream.isatty()

    def _write(self, text, done):
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r\033[K" + text + ("\n" if done else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def step(self, index, what, step, steps):
        """``what`` (the split, or the reference) of split ``index`` (0-based) has finished ``step`` of ``steps``."""
        elapsed = time.monotonic() - self.started
        self._write(f"ds_gas_check: [{index + 1}/{self.total}] {what}: step {step}/{steps}, {elapsed:.1f} s elapsed",
                    done=step == steps)


def quiet():
    return Progress(1, enabled=False)
