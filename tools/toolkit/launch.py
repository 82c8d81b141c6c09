# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Launch N CPU ranks and collect what each rank reported: by default as the ``deepspeed`` launcher starts them on
one node (``local_ranks.py``: the same variables, without its two torch-importing processes); with
``deepspeed_command()``, the installed launcher itself (the tests of the launcher and of README's command); or a
client's, ``accelerate launch``.

Each rank's start-up (torch, deepspeed, its ops) still costs seconds, so one launch runs many cases (see
``rank_cases.py``); each launch gets a free master port, the run's private extensions directory, a hard timeout,
and its ``/dev/shm`` all-reduce buffers removed afterwards.
"""

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from toolkit import REPO
from toolkit.ports import free_port

EXTENSIONS_DIR_VAR = "DS_GAFIX_TEST_EXTENSIONS_DIR"
# Where a rank's script finds the tests' helpers (tests/helpers; the layer, toolkit, is installed in the environment).
# Never the repository's root, whose deepspeed/ would shadow the installed one.
RANK_IMPORT_ROOTS = (REPO / "tests", )
LOCAL_RANKS = Path(__file__).with_name("local_ranks.py")
SHM_BUFFER_GLOB = "/dev/shm/deepspeed_allreduce_buffer_*_{port}_*"


class LaunchError(AssertionError):
    """The launch failed as a whole: non-zero exit, timeout, or a rank that wrote no results."""


def rank_pythonpath(current=None):
    """``PYTHONPATH`` for a process that runs a rank's script: ``RANK_IMPORT_ROOTS`` first, then ``current``."""
    roots = [str(root) for root in RANK_IMPORT_ROOTS]
    return os.pathsep.join(roots +
                           [entry for entry in (current or "").split(os.pathsep) if entry and entry not in roots])


def installed_script(name):
    """The console script ``name`` of the interpreter running the tests, so the same install is tested."""
    beside = Path(sys.executable).with_name(name)
    found = str(beside) if beside.exists() else shutil.which(name)
    if not found:
        raise LaunchError(f"no '{name}' found beside python or on PATH: is its package installed?")
    return found


def local_ranks_command(python=None):
    """``local_ranks.py --nprocs N``: the ranks as ``deepspeed --num_gpus N --no_local_rank`` starts them, under the
    interpreter running the tests (what ``run_launcher`` starts by default) or another install's (``python``, a
    path: pristine's)."""

    def command(nprocs, port):
        return [python or sys.executable, str(LOCAL_RANKS), "--nprocs", str(nprocs), "--master_port", str(port)]

    return command


def deepspeed_command(launcher=None):
    """``deepspeed --num_gpus N --no_local_rank``: the launcher of the interpreter running the tests, or another
    install's (``launcher``, a path: pristine's)."""

    def command(nprocs, port):
        return [
            launcher or installed_script("deepspeed"), "--num_gpus",
            str(nprocs), "--no_local_rank", "--master_port",
            str(port)
        ]

    return command


def accelerate_command(*options):
    """``accelerate launch`` with ``options`` (``--use_deepspeed``, ``--zero_stage=3``, ...): a client's launcher."""

    def command(nprocs, port):
        return [
            installed_script("accelerate"), "launch", f"--num_processes={nprocs}", "--num_machines=1",
            f"--main_process_port={port}", *options
        ]

    return command


@dataclass
class LauncherRun:
    returncode: int
    log: str
    leaked_shm: list  # /dev/shm all-reduce buffers the launch left behind (now removed)

    def tail(self, lines=40):
        return _tail(self.log, lines)


@dataclass
class LaunchResult(LauncherRun):
    ranks: list = field(default_factory=list)  # per rank: {case name: {"ok", "value" | "error"}}

    def case(self, name):
        """The values every rank returned for ``name``; fails with the rank's traceback when one raised."""
        values = []
        for rank, cases in enumerate(self.ranks):
            if name not in cases:
                raise LaunchError(f"rank {rank} reported nothing for case '{name}'\n{self.tail()}")
            if not cases[name]["ok"]:
                raise AssertionError(f"case '{name}' raised on rank {rank}:\n{cases[name]['error']}")
            values.append(cases[name]["value"])
        return values


def run_launcher(script, nprocs, args=(), timeout=600, extensions_dir=None, env=None, on_timeout=None, launcher=None):
    """Run ``script args...`` on ``nprocs`` ranks and return a LauncherRun.

    A launch still running after ``timeout`` seconds is killed and raises LaunchError, with what
    ``on_timeout()`` says about where the ranks were. ``launcher(nprocs, port)`` gives the command before the
    script (default ``local_ranks_command()``).
    """
    # The port is free when picked but not held: another launch (a pytest-xdist worker's, or gloo's own connections)
    # may take it before rank 0's store listens. Then no rank ran, and the launch runs again on another port.
    for _ in range(PORT_ATTEMPTS):
        run = _run_launcher_once(script, nprocs, args, timeout, extensions_dir, env, on_timeout, launcher)
        if run.returncode == 0 or not _port_taken(run.log):
            return run
    return run


PORT_ATTEMPTS = 3


def _port_taken(log):
    """Whether rank 0's rendezvous store could not listen on its port: torch's message for it."""
    return "server socket has failed to listen" in log and "EADDRINUSE" in log


def _run_launcher_once(script, nprocs, args, timeout, extensions_dir, env, on_timeout, launcher):
    port = free_port()
    cmd = [*(launcher or local_ranks_command())(nprocs, port), str(script), *args]
    run_env = dict(os.environ)
    run_env.update(env or {})
    run_env["PYTHONPATH"] = rank_pythonpath(run_env.get("PYTHONPATH"))
    if extensions_dir:
        run_env["TORCH_EXTENSIONS_DIR"] = str(extensions_dir)
    # Ranks share this machine's few cores: one thread each avoids oversubscription.
    run_env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.Popen(cmd,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT,
                            text=True,
                            env=run_env,
                            start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        where = f"; {on_timeout()}" if on_timeout else ""
        raise LaunchError(f"launch of {Path(script).name} timed out after {timeout} s (a hang?){where}\n"
                          f"{_tail(log)}") from None
    finally:
        leaked = sorted(glob.glob(SHM_BUFFER_GLOB.format(port=port)))
        for leftover in leaked:
            os.unlink(leftover)
    return LauncherRun(returncode=proc.returncode, log=log, leaked_shm=leaked)


def launch_cases(script, nprocs, cases=(), timeout=600, extensions_dir=None, env=None, extra_args=(), launcher=None):
    """Launch a worker script built on ``rank_cases.run_cases`` and return what each rank reported."""
    with tempfile.TemporaryDirectory(prefix="ds-gafix-launch-") as results_dir:
        args = ["--results-dir", results_dir, "--cases", ",".join(cases), *extra_args]
        run = run_launcher(script,
                           nprocs,
                           args,
                           timeout,
                           extensions_dir,
                           env,
                           on_timeout=lambda: _progress(results_dir, nprocs),
                           launcher=launcher)
        ranks = []
        for rank in range(nprocs):
            path = Path(results_dir) / f"rank{rank}.json"
            if not path.exists():
                raise LaunchError(f"rank {rank} wrote no results (exit {run.returncode}); "
                                  f"{_progress(results_dir, nprocs)}\n{_tail(run.log)}")
            ranks.append(json.loads(path.read_text()))
        return LaunchResult(returncode=run.returncode, log=run.log, leaked_shm=run.leaked_shm, ranks=ranks)


def _progress(results_dir, nprocs):
    notes = []
    for rank in range(nprocs):
        path = Path(results_dir) / f"rank{rank}.progress"
        notes.append(f"rank {rank}: {path.read_text().strip() if path.exists() else 'not started'}")
    return "; ".join(notes)


def _tail(log, lines=40):
    return "\n".join(log.splitlines()[-lines:])


class LaunchesByRanks:
    """Launches of one worker, one per rank count, each made the first time a test asks for it (so
    tests of a rank count that all skip, slow ones in CI, cost no launch). ``cases_for(ranks)``: the
    case names to run at that rank count."""

    def __init__(self, script, cases_for, extensions_dir=None, timeout=900):
        self.script, self.cases_for, self.extensions_dir, self.timeout = script, cases_for, extensions_dir, timeout
        self.done = {}

    def __getitem__(self, ranks):
        if ranks not in self.done:
            self.done[ranks] = launch_cases(self.script,
                                            nprocs=ranks,
                                            cases=self.cases_for(ranks),
                                            extensions_dir=self.extensions_dir,
                                            timeout=self.timeout)
        return self.done[ranks]
