# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""``--rerun-regressions``: run the fork side of each current regression once more, on the record.

On 2 shared cores a distributed test can time out on one side only because other jobs had the machine
(upstream's ``TestRealCheckpointUniversalConversionTPxPP``: 122 s on pristine, past 300 s on the fork while
our own tests ran). Such a regression must neither stand nor be dropped by hand: the fork-side outcome of
each regression is moved to ``reruns-fork.json`` beside the results (kept, and counted in the report) and
its file resumes, so that test, and only it, runs again; the second outcome is the one compared. A real
regression fails twice."""

import json
from pathlib import Path

from upstream_suite.classify import REGRESSION, compare

LOG_NAME = "reruns-fork.json"


def _load(path):
    return json.loads(path.read_text()) if path.exists() else []


def take_regressions(fork, pristine, results_dir):
    """Move the fork's outcomes of the regressions among the files both sides finished to the reruns log and
    reopen their files; returns the test ids."""
    finished = fork.done_units & pristine.done_units
    ours = {test_id: result for test_id, result in fork.tests.items() if result["unit"] in finished}
    theirs = {test_id: result for test_id, result in pristine.tests.items() if result["unit"] in finished}
    taken = [row.test_id for row in compare(ours, theirs) if row.category == REGRESSION]
    if not taken:
        return []
    path = Path(results_dir) / LOG_NAME
    log = _load(path)
    for test_id in taken:
        first = fork.tests.pop(test_id, None)
        fork.done_units.discard((first or theirs[test_id])["unit"])
        log.append({"test_id": test_id, **(first or {"outcome": "missing", "reason": "", "duration": 0.0})})
    fork.save()
    path.write_text(json.dumps(log, indent=1))
    return taken


def summary(results_dir):
    """A line for the report on the tests run again, or "" when none was."""
    log = _load(Path(results_dir) / LOG_NAME)
    if not log:
        return ""
    firsts = {}
    for entry in log:
        firsts[entry["outcome"]] = firsts.get(entry["outcome"], 0) + 1
    counts = ", ".join(f"{count} {outcome}" for outcome, count in sorted(firsts.items()))
    return (f"Run again once after a first regression (`--rerun-regressions`; first outcomes in {LOG_NAME}): "
            f"{len(log)} fork outcome(s), first {counts}; the table compares the second.")
