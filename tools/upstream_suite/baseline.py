# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Pristine upstream's outcomes, recorded once and replayed, so CI runs only the fork's side.

Pristine's outcomes depend only on the pin (upstream.json's sdist sha256), upstream's tests tree and
the environment that runs them (torch, pytest, Python, LOCAL_SIZE). A baseline stores them with exactly those
keys and is refused when any differs, or when it lacks a unit of the tier: re-record it then
(``tools/run-upstream-suite --tier patch --record-baseline``). It also stores which ops the recording machine
could build (a test that needs an op skips where it cannot: async_io without libaio), and is refused on a
machine where an op both sides have builds the other way; and the machine's CPU vendor and the dtypes its
accelerator supports, refused where either differs (upstream's tests skip fp16 where the CPU lacks it, and
cpu_adam's and cpu_lion's half precision on AMD: replayed on another machine those read as regressions and fixes
that are none). A baseline recorded before it kept either replays with a note saying so in the report.
"""

import hashlib
import json
from pathlib import Path

BASELINE_DIR = Path(__file__).resolve().parent / "baselines"
# What must match between the recording and the run that replays it.
KEYS = ("pin_sha256", "pristine_version", "tests_sha256", "torch", "pytest", "python", "local_size")


class BaselineError(Exception):
    """The baseline is missing, stale, or does not cover the tier."""


CACHE_DIRS = {"__pycache__", ".pytest_cache"}


def tree_sha256(tests_dir, leave_out=()):
    """One hash of every file under the tests tree (relative path and content), caches excluded: a
    pytest run inside the tree (its .pytest_cache) must not make a recorded baseline look stale.
    ``leave_out``: relative paths not hashed either."""
    root = Path(tests_dir)
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        parts = path.relative_to(root).parts
        if not path.is_file() or CACHE_DIRS.intersection(parts) or path.suffix == ".pyc":
            continue
        if str(path.relative_to(root)) in leave_out:
            continue
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def default_path(tier):
    return BASELINE_DIR / f"{tier}.json"


def record(path, identity, outcomes, unit_keys):
    missing = [key for key in unit_keys if key not in outcomes.done_units]
    if missing:
        raise BaselineError(f"pristine did not finish {len(missing)} unit(s) ({missing[0]} ...): nothing recorded")
    data = {
        "keys": {
            key: identity[key]
            for key in KEYS
        },
        "ops": outcomes.identity.get("ops"),
        "machine": outcomes.identity.get("machine"),
        "units": sorted(unit_keys),
        "tests": {
            test_id: result
            for test_id, result in outcomes.tests.items() if result["unit"] in unit_keys
        },
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def as_baseline(data):
    """A baseline as recorded, or a pristine side's results file (``results-pristine.json`` of a finished run, its
    identity holding the keys and more): either replays, so a tier's own record serves without a second copy."""
    if "identity" not in data:
        return data
    identity = data["identity"]
    return {
        "keys": dict(identity, pristine_version=identity.get("deepspeed")),
        "ops": identity.get("ops"),
        "machine": identity.get("machine"),
        "units": data.get("done_units", []),
        "tests": data.get("tests", {}),
    }


def stale_keys(recorded, now, keys):
    """What differs between a record's keys and this run's ("key: recorded X, now Y; ..."), or "" when none."""
    return "; ".join(f"{key}: recorded {recorded.get(key)!r}, now {now[key]!r}" for key in keys
                     if recorded.get(key) != now[key])


def ops_differing(recorded, now):
    """The ops that both maps ({op name: builds here}) name and that build on one machine only. An op only one
    side has (the fork's fused_norm) is no difference between machines."""
    return sorted(name for name in set(recorded) & set(now) if recorded[name] != now[name])


def describe_machine(machine):
    return f"CPU vendor {machine.get('cpu_vendor') or 'unknown'}, dtypes {', '.join(machine.get('dtypes', []))}"


def machine_differs(recorded, now):
    """Whether a recorded machine ({cpu_vendor, dtypes}) differs from this one in what upstream's tests skip on;
    False where the record does not say (a record older than the check)."""
    return recorded is not None and (recorded.get("cpu_vendor") != now.get("cpu_vendor")
                                     or sorted(recorded.get("dtypes", [])) != sorted(now.get("dtypes", [])))


def load(path, identity, unit_keys, ops, machine):
    """The recorded pristine outcomes ({test id: result}) for these units, the ops the recording machine could
    build ({op name: builds}) and that machine's CPU vendor and dtypes (each None in a baseline recorded before
    it was kept); raises when unusable. ``ops``, ``machine``: this machine's (the fork side's probe)."""
    path = Path(path)
    if not path.exists():
        raise BaselineError(f"no pristine baseline at {path}: record one with --record-baseline {path}")
    data = as_baseline(json.loads(path.read_text()))
    stale = stale_keys(data["keys"], identity, KEYS)
    if stale:
        raise BaselineError(f"pristine baseline {path} was recorded for another setup ({stale}): "
                            "re-record it with --record-baseline, or run the pristine side")
    differing = ops_differing(data.get("ops") or {}, ops)
    if differing:
        detail = ", ".join(f"{name} {'builds' if data['ops'][name] else 'does not build'} there, "
                           f"{'does' if ops[name] else 'does not'} here" for name in differing)
        raise BaselineError(f"pristine baseline {path} was recorded on a machine that builds other ops ({detail}): "
                            "a test that needs one would skip on one side only. Give this machine what the op "
                            "needs (async_io: Debian's libaio-dev) or run the pristine side")
    if machine_differs(data.get("machine"), machine):
        raise BaselineError(f"pristine baseline {path} was recorded on another kind of machine "
                            f"({describe_machine(data['machine'])}; here {describe_machine(machine)}): upstream's "
                            "tests skip fp16 where the CPU lacks it and cpu_adam's and cpu_lion's half precision on "
                            "AMD, so a replay would read those as regressions and fixes. Run the pristine side here")
    lacking = [key for key in unit_keys if key not in data["units"]]
    if lacking:
        raise BaselineError(f"pristine baseline {path} lacks {len(lacking)} unit(s) of this run ({lacking[0]} ...): "
                            "re-record it with --record-baseline")
    tests = {test_id: result for test_id, result in data["tests"].items() if result["unit"] in unit_keys}
    return tests, data.get("ops"), data.get("machine")
