# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Pristine upstream's client-tier outcomes, recorded once and replayed, so CI runs only the fork's side.

Pristine's outcomes depend only on the pin (upstream.json's sdist sha256), the client tests tree, the -k
expression and the packages that run them (torch, Python, pytest, transformers, accelerate, datasets): a record
stores them with exactly those keys and is refused when any differs or when it lacks a selection of the run
(``tools/client-tier --record-baseline``). The fork's side must then agree with it as with a pristine run: the
fork passing a test pristine passes, skipping none it runs.
"""

import json
from pathlib import Path

from upstream_suite.baseline import BaselineError, stale_keys

DEFAULT = Path(__file__).resolve().parent / "baselines" / "pristine.json"
KEYS = ("pin_sha256", "pristine_version", "tests_sha256", "keyword", "torch", "python", "pytest", "transformers",
        "accelerate", "datasets")


def record(path, identity, selections):
    """Write pristine's outcomes and seconds per selection ({name: {"outcomes": ..., "seconds": ...}})."""
    data = {"keys": {key: identity[key] for key in KEYS}, "selections": selections}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def load(path, identity, names):
    """Pristine's recorded selections ``names`` ({name: {"outcomes", "seconds"}}); raises BaselineError, saying
    why, when the record is missing, was made for another setup or lacks one of them."""
    path = Path(path)
    if not path.exists():
        raise BaselineError(f"no client-tier baseline at {path}: record one with --record-baseline {path}")
    data = json.loads(path.read_text())
    stale = stale_keys(data["keys"], identity, KEYS)
    if stale:
        raise BaselineError(f"client-tier baseline {path} was recorded for another setup ({stale}): re-record it "
                            "with --record-baseline, or run the pristine side")
    lacking = [name for name in names if name not in data["selections"]]
    if lacking:
        raise BaselineError(f"client-tier baseline {path} lacks selection(s) {', '.join(lacking)}: re-record it "
                            "with --record-baseline")
    return {name: data["selections"][name] for name in names}
