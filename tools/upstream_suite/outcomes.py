# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Per-test outcomes of one side (fork or pristine), kept in a JSON file written after every test.

The file is what makes a long tier resumable: a rerun skips every unit already marked done and, inside
an unfinished unit, every test that already has an outcome. It records what it was produced from
(deepspeed version, tests tree hash, ...) and refuses to be resumed by a different setup.
"""

import json
import os
import threading
from pathlib import Path

PASSING = ("passed", "xfailed")
FAILING = ("failed", "error", "timeout", "crashed", "xpassed")
SKIPPING = ("skipped", )


def kind_of(outcome):
    """'ok', 'bad' or 'skip' for a recorded outcome (an unknown outcome is 'bad': never silently ok)."""
    if outcome in PASSING:
        return "ok"
    if outcome in SKIPPING:
        return "skip"
    return "bad"


class OutcomeMismatch(Exception):
    """A results file was produced by another setup than the one asked to resume it."""


def _difference(key, old, new):
    if isinstance(old, list) and isinstance(new, list):  # e.g. the installed packages: what differs
        return (f"{key}: only recorded {sorted(set(old) - set(new))}, only now {sorted(set(new) - set(old))} "
                f"(recorded: pip install {' '.join(old)})")
    if isinstance(old, dict) and isinstance(new, dict):  # e.g. which ops the machine can build: those that differ
        return f"{key}: " + ", ".join(f"{name} recorded {old.get(name)!r}, now {new.get(name)!r}"
                                      for name in sorted(set(old) | set(new)) if old.get(name) != new.get(name))
    return f"{key}: recorded {old!r}, now {new!r}"


class SideOutcomes:
    """Outcomes of one side: ``tests`` maps a test id to {outcome, reason, duration, unit}.

    Safe to share between threads (``--jobs``: several units of one side at once).
    """

    def __init__(self, path, identity):
        self._lock = threading.RLock()
        self.path = Path(path) if path else None
        self.identity = dict(identity)
        self.tests = {}
        self.done_units = set()
        if self.path is not None and self.path.exists():
            self._load()

    def _load(self):
        data = json.loads(self.path.read_text())
        stored = data.get("identity", {})
        differs = {key: (stored.get(key), value) for key, value in self.identity.items() if stored.get(key) != value}
        if differs:
            detail = "; ".join(_difference(key, old, new) for key, (old, new) in sorted(differs.items()))
            raise OutcomeMismatch(f"{self.path} was recorded with another setup ({detail}): "
                                  "remove it or pass another --work-dir to start afresh")
        self.tests = data.get("tests", {})
        self.done_units = set(data.get("done_units", []))

    def record(self, test_id, outcome, reason, duration, unit):
        with self._lock:
            self.tests[test_id] = {"outcome": outcome, "reason": reason, "duration": duration, "unit": unit}
            self.save()

    def mark_done(self, unit):
        with self._lock:
            self.done_units.add(unit)
            self.save()

    def of_unit(self, unit):
        with self._lock:
            return {test_id: result for test_id, result in self.tests.items() if result["unit"] == unit}

    def as_json(self):
        with self._lock:
            return {"identity": self.identity, "done_units": sorted(self.done_units), "tests": dict(self.tests)}

    def save(self):
        if self.path is None:
            return
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            scratch = self.path.with_suffix(".tmp")
            scratch.write_text(json.dumps(self.as_json(), indent=1, sort_keys=True))
            os.replace(scratch, self.path)
