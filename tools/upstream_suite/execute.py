# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Run one unit (a test file, optionally narrowed by ``-k``) of upstream's tests with one interpreter.

pytest runs in a process group of its own with ``pytest_plugin`` reporting each event live. A test
that runs longer than the timeout is killed with its whole process group (DistributedTest's rank
processes included) and recorded as ``timeout``; a process that dies inside a test records it as
``crashed``. Either way the rest of the unit is run again in a fresh process, without the tests that
already have an outcome, so one hang costs one test, not the tier.
"""

import ctypes
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from toolkit import sides

from upstream_suite import console_scripts
from upstream_suite.held_files import held_paths, unheld

TOOLS_DIR = Path(__file__).resolve().parent.parent
SHM_DIR = Path("/dev/shm")
# Left behind in /dev/shm, removed after each pytest process once no process holds them, or a long tier fills it:
# pristine upstream's CPU comm op buffers (69 MB a rank, never unlinked) and the named semaphores of multiprocessing
# pools (upstream's DistributedTest), which a pytest process group killed at a timeout leaves with their tracker.
SHM_PREFIXES = ("deepspeed_allreduce_buffer_", "sem.mp-")
POLL_S = 0.5


@dataclass(frozen=True)
class Side:
    name: str  # "fork" or "pristine"
    python: str
    extensions_dir: Path
    package_dir: str  # where its deepspeed package is installed
    environ: dict = field(default_factory=dict, hash=False, compare=False)  # added to the child's env


@dataclass(frozen=True)
class Unit:
    path: str  # a test file, relative to the tests directory
    keyword: str = ""  # pytest -k expression, "" for the whole file

    @property
    def key(self):
        return f"{self.path} -k {self.keyword}" if self.keyword else self.path


def child_environ(side, events_path, timeout_s, local_size):
    env = {key: value for key, value in sides.clean_environ().items() if not key.startswith("UPSTREAM_SUITE_")}
    env.update(side.environ)
    # The side's own path entries (a prefix's package: tools/upstream_suite/prefixes.py) come first.
    env["PYTHONPATH"] = os.pathsep.join(entry for entry in (side.environ.get("PYTHONPATH"), str(TOOLS_DIR)) if entry)
    # The side's console scripts first, as in its venv activated: upstream's launcher tests run `deepspeed`.
    scripts = str(console_scripts.scripts_dir(side.python))
    env["PATH"] = os.pathsep.join(entry for entry in (scripts, env.get("PATH")) if entry)
    env["UPSTREAM_SUITE_EVENTS"] = str(events_path)
    env["TORCH_EXTENSIONS_DIR"] = str(side.extensions_dir)
    # DistributedTest's own worker timeout fires first when it can (a clean failure with a message).
    env["DS_UNITTEST_TIMEOUT"] = str(max(30, timeout_s - 30))
    if local_size:
        env["LOCAL_SIZE"] = str(local_size)  # the CPU accelerator's device_count()
    return env


def _shm_names(shm_dir=SHM_DIR):
    try:
        return {name for name in os.listdir(shm_dir) if name.startswith(SHM_PREFIXES)}
    except FileNotFoundError:
        return set()


def _read_events(path, offset):
    """Complete JSON lines appended since ``offset``, and the new offset."""
    if not path.exists():
        return [], offset
    with open(path) as events:
        events.seek(offset)
        data = events.read()
    complete = data[:data.rfind("\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line.strip()], offset + len(complete)


def _die_with_the_runner():
    """In the child: SIGKILL it when the runner dies (Linux), so no orphaned pytest runs on alone."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@dataclass
class Attempt:
    collected: list = field(default_factory=list)
    results: list = field(default_factory=list)  # (test id, outcome, reason, duration)
    returncode: int = 0
    tail: str = ""


def remove_stale_build_locks(extensions_dir, held):
    """Delete the ``lock`` files torch's JIT builder left in ``extensions_dir``; return their paths.

    torch creates ``<op>/lock`` while it builds an op, keeps it open, and deletes it after; a build
    killed in between (a test past its timeout, a stopped runner) leaves it behind, and every later
    load of that op waits for it forever: each following test of the side hangs until its timeout. A
    lock no process holds open is such a leftover; one held is a build running in a pytest process
    beside this one (``--jobs``), and stays. ``held``: ``held_files.held_paths()``; None (no /proc)
    takes every lock for a leftover, true only while no other process of the side runs (``--jobs 1``).
    """
    root = Path(extensions_dir)
    locks = unheld(sorted(root.glob("*/lock")) if root.is_dir() else [], held)
    for lock in locks:
        lock.unlink(missing_ok=True)
    return locks


def remove_left_shm_buffers(before, held, shm_dir=SHM_DIR):
    """Delete the ``/dev/shm`` files of ``SHM_PREFIXES`` that no process holds; return their names.

    ``before``: the names there when this pytest process started. Where ``held`` is None (no /proc)
    only those made since are taken, true only while no other pytest process runs beside.
    """
    names = _shm_names(shm_dir) if held is not None else _shm_names(shm_dir) - before
    left = unheld(sorted(Path(shm_dir) / name for name in names), held)
    for path in left:
        path.unlink(missing_ok=True)
    return [path.name for path in left]


def pytest_command(side, unit, skip_ids):
    """pytest over ``unit`` minus ``skip_ids``, reporting each event through the plugin."""
    command = [side.python, "-m", "pytest", unit.path, "-p", "upstream_suite.pytest_plugin", "-p", "no:cacheprovider"]
    if unit.keyword:
        command += ["-k", unit.keyword]
    for test_id in sorted(skip_ids):
        command += ["--deselect", test_id]
    return command


def start_pytest(command, tests_dir, env, log):
    """pytest in a session (a process group) of its own, which dies with the runner and is killed as a whole."""
    return subprocess.Popen(command,
                            cwd=tests_dir,
                            env=env,
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL,
                            start_new_session=True,
                            preexec_fn=_die_with_the_runner)


def run_attempt(side, unit, tests_dir, skip_ids, timeout_s, log_path, local_size, echo, on_result):
    """One pytest process over ``unit`` minus ``skip_ids``; kills it when a test exceeds ``timeout_s``.

    ``on_result(test_id, outcome, reason, duration)`` is called as each outcome arrives, so it is kept
    even if this process (or the runner) is killed before the file ends.
    """
    attempt = Attempt()

    def result(*outcome):
        attempt.results.append(outcome)
        on_result(*outcome)

    events_path = log_path.with_suffix(".events")
    events_path.unlink(missing_ok=True)
    command = pytest_command(side, unit, skip_ids)
    shm_before = _shm_names()
    running, started, offset = None, time.monotonic(), 0
    with open(log_path, "a") as log:
        for lock in remove_stale_build_locks(side.extensions_dir, held_paths()):
            log.write(f"removed a JIT build lock left by a killed build: {lock}\n")
        log.write(f"\n$ {' '.join(command)}\n")
        log.flush()
        proc = start_pytest(command, tests_dir, child_environ(side, events_path, timeout_s, local_size), log)
        while True:
            finished = proc.poll() is not None
            events, offset = _read_events(events_path, offset)
            for event in events:
                if event["event"] == "collected":
                    attempt.collected = event["ids"]
                elif event["event"] == "collect_error":
                    result(event["id"], "error", "collection: " + event["reason"], 0.0)
                elif event["event"] == "start":
                    running, started = event["id"], time.monotonic()
                elif event["event"] == "result":
                    result(event["id"], event["outcome"], event["reason"], event["duration"])
                    echo(side, event["id"], event["outcome"], event["duration"])
                    running, started = None, time.monotonic()
            if finished:
                break
            if time.monotonic() - started > timeout_s:
                _kill_group(proc)
                what = running or f"{unit.path}::<collection>"
                result(what, "timeout", f"killed after {timeout_s} s", float(timeout_s))
                echo(side, what, "timeout", float(timeout_s))
                running = None
                break
            time.sleep(POLL_S)
        attempt.returncode = proc.returncode
        if running is not None:  # the process ended inside a test
            result(running, "crashed", f"pytest exited with {proc.returncode} inside the test", 0.0)
            echo(side, running, "crashed", 0.0)
    remove_left_shm_buffers(shm_before, held_paths())
    attempt.tail = log_tail(log_path)
    return attempt


def log_tail(log_path):
    """The log's last three lines that hold anything, on one line (300 characters at most)."""
    with open(log_path) as log:
        return " | ".join(line.strip() for line in log.read().splitlines()[-3:] if line.strip())[-300:]


def run_unit(side, unit, tests_dir, outcomes, timeout_s, log_dir, local_size=8, echo=lambda *args: None):
    """Run ``unit`` on ``side`` until every collected test has an outcome in ``outcomes``."""
    if unit.key in outcomes.done_units:
        return
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / (unit.key.replace("/", "__").replace(" ", "_") + f".{side.name}.log")
    collected = set()
    while True:
        known = set(outcomes.of_unit(unit.key))

        def keep(test_id, outcome, reason, duration):
            outcomes.record(test_id, outcome, reason, duration, unit.key)

        attempt = run_attempt(side, unit, tests_dir, known, timeout_s, log_path, local_size, echo, keep)
        collected |= set(attempt.collected)
        remaining = collected - set(outcomes.of_unit(unit.key))
        if not attempt.collected and not attempt.results and attempt.returncode not in (0, 5):
            # pytest stopped before collecting anything (5 is "no tests collected": e.g. all deselected).
            outcomes.record(unit.key, "error", f"pytest exited with {attempt.returncode}: {attempt.tail}", 0.0,
                            unit.key)
            break
        if not remaining or not attempt.results:
            for test_id in sorted(remaining):  # no progress: never loop; say what was not run
                outcomes.record(test_id, "error", f"not run: pytest exited with {attempt.returncode}", 0.0, unit.key)
            break
    outcomes.mark_done(unit.key)
