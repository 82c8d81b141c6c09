# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The tests' own way of starting ranks (tools/toolkit/local_ranks.py) starts them as the installed ``deepspeed``
launcher does on one node: the same environment and interpreter arguments for each rank, a failed rank ends the
launch with its code; and with no torch-importing process above the ranks, where the launcher has two."""

import json
import os
import time

import psutil
import pytest

from toolkit.launch import deepspeed_command, local_ranks_command, run_launcher
from toolkit.local_ranks import RANK_VARIABLES
from helpers.repo import REPO

PROBE = REPO / "tests" / "workers" / "launch_probe.py"
NPROCS = 2


@pytest.fixture(scope="module")
def started(tmp_path_factory):
    """launcher -> what each rank of a 2-rank launch reported."""
    reports = {}
    for name, launcher in (("deepspeed", deepspeed_command()), ("local_ranks", local_ranks_command())):
        out = tmp_path_factory.mktemp(name)
        run = run_launcher(PROBE,
                           NPROCS, ["--out", str(out), "--below", str(os.getpid())],
                           timeout=300,
                           launcher=launcher)
        assert run.returncode == 0, f"{name}:\n{run.tail()}"
        ranks = [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(NPROCS)]
        for rank in ranks:
            rank["argv"] = ["OUT" if arg == str(out) else arg for arg in rank["argv"]]
        reports[name] = ranks
    return reports


def test_each_rank_gets_the_launchers_environment_and_arguments(started):
    for rank in range(NPROCS):
        launcher, ours = started["deepspeed"][rank], started["local_ranks"][rank]
        assert ours["argv"] == launcher["argv"], "the ranks' interpreter arguments differ"
        # Every variable, not only the ones local_ranks sets: one a later launcher adds fails here. The port is
        # each launch's own.
        differ = sorted(key for key in set(launcher["env"]) | set(ours["env"])
                        if key != "MASTER_PORT" and launcher["env"].get(key) != ours["env"].get(key))
        assert differ == [], {key: (launcher["env"].get(key), ours["env"].get(key)) for key in differ}
        assert set(RANK_VARIABLES) <= set(ours["env"])
        assert ours["env"]["RANK"] == ours["env"]["LOCAL_RANK"] == str(rank)


def test_no_torch_is_imported_above_the_ranks(started):
    # What the tests' launches save: two processes that import deepspeed, and so torch, before any rank starts.
    for rank in range(NPROCS):
        assert [p["loads_torch"] for p in started["deepspeed"][rank]["above"]] == [True, True]
        assert [p["loads_torch"] for p in started["local_ranks"][rank]["above"]] == [False]


def test_a_failed_rank_ends_the_launch_with_its_code(tmp_path):
    started_at = time.monotonic()
    run = run_launcher(
        PROBE, NPROCS,
        ["--out", str(tmp_path), "--below", str(os.getpid()), "--fail-rank", "1"], timeout=120)
    assert run.returncode == 3, run.tail()
    assert time.monotonic() - started_at < 60, "the waiting rank was not ended"
    waiting = int((tmp_path / "rank0.pid").read_text())
    assert not psutil.pid_exists(waiting) or psutil.Process(waiting).status() == psutil.STATUS_ZOMBIE
    assert "rank 1 exited with 3" in run.log


def test_a_launch_whose_port_was_taken_runs_again_on_another(tmp_path):
    """free_port's port is not held until rank 0's store listens: a launch that lost it ran nothing, and runs again
    on a port picked again. Any other failure is the launch's own and is not run again."""
    import sys
    script = tmp_path / "rank.py"
    script.write_text(
        "import pathlib, sys\n"
        "tries = pathlib.Path(sys.argv[1])\n"
        "tries.write_text(tries.read_text() + sys.argv[2] + '\\n' if tries.exists() else sys.argv[2] + '\\n')\n"
        "if len(tries.read_text().split()) == 1:\n"
        "    sys.exit(print(f'{sys.argv[3]}: port: {sys.argv[2]}, code: -98, name: EADDRINUSE') or 1)\n")

    def launcher(message):
        return lambda nprocs, port: [sys.executable, str(script), str(tries), str(port), message]

    tries = tmp_path / "taken"
    run = run_launcher("", 1, launcher=launcher("The server socket has failed to listen on any local network address"))
    assert run.returncode == 0
    assert len(tries.read_text().split()) == 2, "the launch that lost its port did not run again, once"

    tries = tmp_path / "other"
    run = run_launcher("", 1, launcher=launcher("some other failure"))
    assert run.returncode == 1 and len(tries.read_text().split()) == 1
