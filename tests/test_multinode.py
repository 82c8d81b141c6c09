# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The ``deepspeed`` launcher across nodes for real: nodes made on this machine (tests/helpers/nodes.py: a network
namespace, hostname, process and mount namespaces and an sshd each), the runner started on node 0 as a user logged
in there starts it, reaching every node through pdsh and ssh.

- The demo (examples/gas_demo.py) across 2 nodes agrees with its fp64 reference.
- The demo on 3 nodes of unequal size, and with ``--no_ssh`` (the runner started on each node with its rank).
- Every value the runner passes to the other nodes (script arguments, forwarded variables, .deepspeed_env lines)
  arrives byte for byte and is never run (tests/helpers/shell_values.py's table).
- Failures (a rank, a node, the runner stopped or killed) end every process of the job on every node, promptly.
- A node lost in training or in a save: the job resumes on the survivor and continues the uninterrupted run, started
  again by hand or by the runner itself (``--max_restarts``).

``DS_GAFIX_MULTINODE_JSON=FILE`` writes each case's outcome and time there (the slow table of values runs the same
launch on pristine DeepSpeed too).
"""

import importlib.util
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import torch

from helpers.continuation import TOLERANCE, dtype_of, relative_error
from toolkit.launch import installed_script, launch_cases, rank_pythonpath
from helpers.nodes import NODE_INTERFACE, Nodes, require_nodes
from helpers.repo import REPO
from helpers.shell_values import NOT_IN_ENV_FILE, VALUES, filled

DEMO = REPO / "examples" / "gas_demo.py"
PROBE = REPO / "tests" / "workers" / "node_probe.py"
FAILING = REPO / "tests" / "workers" / "node_failure.py"
CRASH_RESUME = REPO / "tests" / "workers" / "crash_resume.py"
# Seconds from a failure to the last process of the job: the runner gives the nodes 30 s to stop their ranks. A node
# that stops answering is noticed by ssh's keepalives first, after about a minute (patch
# Notice-a-node-that-stops-answering-keepalives-on-pds's 15 s x 4).
FULL_STOP_BOUND = 60
SILENT_NODE_BOUND = 60 + FULL_STOP_BOUND
JOB_PROCESSES = "node_failure\\.py|deepspeed\\.launcher\\.launch|bin/deepspeed --hostfile"
LAUNCH_TIMEOUT = 300


def _record(case, outcome):
    path = os.environ.get("DS_GAFIX_MULTINODE_JSON")
    if not path:
        return
    results = json.loads(Path(path).read_text()) if Path(path).exists() else {}
    results[case] = outcome
    Path(path).write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


def start_on_node(nodes, deepspeed, args, cwd, env=None, node=0):
    """The runner ``deepspeed args`` started on ``node`` in ``cwd``, as a user logged in there starts it; its output
    goes to ``cwd``/runner.log. -> the local ssh process."""
    # A rank's script imports the tests' helpers; the runner passes PYTHONPATH on to the other nodes.
    env = {"PYTHONPATH": rank_pythonpath(), **(env or {})}
    env_words = [f"{name}={value}" for name, value in env.items()]
    argv = ["sh", "-c", 'cd "$1" && shift && exec "$@"', "launch", str(cwd), "env", *env_words, deepspeed, *args]
    with open(Path(cwd) / "runner.log", "wb") as log:
        return subprocess.Popen(nodes.ssh_command(node, argv), stdout=log, stderr=subprocess.STDOUT)


def finish(proc, cwd, timeout=LAUNCH_TIMEOUT, must_end=True):
    """-> (return code, output) once the runner ended. One past ``timeout`` fails the test, or, unless ``must_end``,
    gives return code None (the nodes' teardown ends what it left)."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        output = (Path(cwd) / "runner.log").read_text(errors="replace")
        if must_end:
            pytest.fail(f"launch did not end in {timeout} s:\n{output[-4000:]}")
        return None, output
    return proc.returncode, (Path(cwd) / "runner.log").read_text(errors="replace")


def launch_on_node0(nodes, deepspeed, args, cwd, env=None, timeout=LAUNCH_TIMEOUT):
    """start_on_node (node 0) and finish. -> (return code, output, seconds)."""
    started = time.monotonic()
    returncode, output = finish(start_on_node(nodes, deepspeed, args, cwd, env), cwd, timeout)
    return returncode, output, time.monotonic() - started


def _runner(side):
    """The ``deepspeed`` runner of the install under test ("fork") or of pristine upstream's venv."""
    if side == "pristine":
        from helpers.pristine import pristine_python
        return str(Path(pristine_python()).with_name("deepspeed"))
    return installed_script("deepspeed")


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    require_nodes()
    with Nodes(2, tmp_path_factory.mktemp("nodes")) as made:
        yield made


@pytest.fixture
def node_env(extensions_dir):
    """What the user sets where the runner starts: gloo's interface (the runner forwards GLOO_* to every node) and
    the run's private extensions directory."""
    return {"GLOO_SOCKET_IFNAME": NODE_INTERFACE, "TORCH_EXTENSIONS_DIR": str(extensions_dir)}


@pytest.mark.parametrize("stage,slots", [
    (1, 1),
    pytest.param(1, 2, marks=pytest.mark.slow),
    pytest.param(3, 1, marks=pytest.mark.slow),
    (3, 2),
])
def test_demo_across_two_nodes(nodes, node_env, tmp_path, stage, slots):
    hostfile = nodes.hostfile(slots, tmp_path / "hostfile")
    args = ["--hostfile", str(hostfile), "--no_local_rank", str(DEMO), "--zero-stage", str(stage)]
    work = tmp_path / "work"
    work.mkdir()
    returncode, output, seconds = launch_on_node0(nodes, installed_script("deepspeed"), args, work, node_env)
    agrees = returncode == 0 and ": AGREE" in output
    _record(f"demo/zero{stage}/2x{slots}", {"seconds": round(seconds, 1), "agrees": agrees})
    assert agrees, output[-4000:]
    assert f"{2 * slots} rank(s), ZeRO stage {stage}" in output


@pytest.mark.slow
def test_demo_across_three_nodes(node_env, tmp_path):
    """A third node, and nodes of unequal size: node0 runs 2 ranks, node1 and node2 one each."""
    require_nodes()
    work = tmp_path / "work"
    work.mkdir()
    with Nodes(3, tmp_path / "nodes") as nodes:
        hostfile = work / "hostfile"
        hostfile.write_text("node0 slots=2\nnode1 slots=1\nnode2 slots=1\n")
        args = ["--hostfile", str(hostfile), "--no_local_rank", str(DEMO), "--zero-stage", "1"]
        returncode, output, seconds = launch_on_node0(nodes, installed_script("deepspeed"), args, work, node_env)
    agrees = returncode == 0 and ": AGREE" in output
    _record("demo/zero1/3 nodes (2+1+1)", {"seconds": round(seconds, 1), "agrees": agrees})
    assert agrees, output[-4000:]
    assert "4 rank(s), ZeRO stage 1" in output


def test_no_ssh_with_a_node_rank_per_node(nodes, node_env, tmp_path):
    """``--no_ssh``: the user starts the runner on every node (as a scheduler does), each with its ``--node_rank``
    and rank 0's address; no node reaches another over ssh."""
    hostfile = nodes.hostfile(1, tmp_path / "hostfile")
    started = time.monotonic()
    runs = []
    for node in range(2):
        work = tmp_path / f"work{node}"
        work.mkdir()
        args = [
            "--hostfile",
            str(hostfile), "--no_ssh", "--node_rank",
            str(node), "--master_addr", "node0", "--master_port", "29611", "--no_local_rank",
            str(DEMO)
        ]
        runs.append((start_on_node(nodes, installed_script("deepspeed"), args, work, node_env, node=node), work))
    ended = [finish(proc, work) for proc, work in runs]
    seconds = time.monotonic() - started
    agrees = all(code == 0 for code, _ in ended) and ": AGREE" in ended[0][1]
    _record("demo/zero1/2x1 --no_ssh", {"seconds": round(seconds, 1), "agrees": agrees})
    assert agrees, "\n".join(output[-3000:] for _, output in ended)
    assert "2 rank(s), ZeRO stage 1" in ended[0][1]


@pytest.mark.slow
def test_demo_through_openmpi(nodes, node_env, tmp_path):
    """``--launcher openmpi``: mpirun starts the ranks over ssh; DeepSpeed learns the ranks' places from Open MPI
    through mpi4py. As root, Open MPI asks for ``--allow-run-as-root``; its TCP traffic is kept on the nodes'
    interface like gloo's."""
    if shutil.which("mpirun") is None or importlib.util.find_spec("mpi4py") is None:
        pytest.skip("needs Open MPI (Debian's openmpi-bin) and mpi4py")
    hostfile = nodes.hostfile(1, tmp_path / "hostfile")
    interface = f"--mca btl_tcp_if_include {NODE_INTERFACE} --mca oob_tcp_if_include {NODE_INTERFACE}"
    mpi_args = f"--allow-run-as-root {interface}"
    args = [
        "--hostfile",
        str(hostfile), "--launcher", "openmpi", "--launcher_args", mpi_args,
        str(DEMO), "--zero-stage", "1"
    ]
    work = tmp_path / "work"
    work.mkdir()
    returncode, output, seconds = launch_on_node0(nodes, installed_script("deepspeed"), args, work, node_env)
    agrees = returncode == 0 and ": AGREE" in output
    _record("demo/zero1/2x1 openmpi", {"seconds": round(seconds, 1), "agrees": agrees})
    assert agrees, output[-4000:]
    assert "2 rank(s), ZeRO stage 1" in output


def probe_launch(nodes, deepspeed, work, names, marker):
    """The probe on 2 nodes x 1 rank with the values ``names`` as its arguments, as forwarded variables and as
    .deepspeed_env lines. -> (what should arrive, the runner's output, return code, what each rank received)."""
    values = {name: filled(name, marker) for name in names}
    env = {f"PYTHON_DS_PROBE_{index}": value for index, value in enumerate(values.values())}
    file_env = {
        f"DS_PROBE_FILE_{index}": value
        for index, (name, value) in enumerate(values.items()) if name not in NOT_IN_ENV_FILE
    }
    out = work / "out"
    out.mkdir(parents=True)
    (work / ".deepspeed_env").write_text("".join(f"{name}={value}\n" for name, value in file_env.items()))
    hostfile = nodes.hostfile(1, work / "hostfile")
    args = ["--hostfile", str(hostfile), str(PROBE), str(out), *values.values()]
    returncode, output, _ = launch_on_node0(nodes, deepspeed, args, work, env)
    ranks = [json.loads(path.read_text()) for path in sorted(out.glob("rank*.json"))]
    return {"argv": list(values.values()), "env": {**env, **file_env}, "cwd": str(work)}, output, returncode, ranks


def test_values_arrive_on_every_node(nodes, tmp_path):
    marker = tmp_path / "marker"
    expected, output, returncode, ranks = probe_launch(nodes, installed_script("deepspeed"), tmp_path / "work",
                                                       list(VALUES), marker)
    assert not marker.exists(), f"a value was run on a node:\n{output[-4000:]}"
    assert returncode == 0, output[-4000:]
    assert sorted((rank["rank"], rank["node"]) for rank in ranks) == [(0, "node0"), (1, "node1")], output[-4000:]
    for rank in ranks:
        assert {key: rank[key] for key in expected} == expected, f"rank {rank['rank']}"


@pytest.mark.parametrize("filters,placed", [
    (["--include", "node1"], [("node1", 0), ("node1", 1)]),
    (["--exclude", "node0:1"], [("node0", 0), ("node1", 0), ("node1", 1)]),
    (["--num_nodes", "1"], [("node0", 0), ("node0", 1)]),
    (["--num_gpus", "1"], [("node0", 0), ("node1", 0)]),
],
                         ids=["include-node1", "exclude-node0-slot1", "num_nodes-1", "num_gpus-1"])
def test_filters_place_ranks(nodes, node_env, tmp_path, filters, placed):
    """--include, --exclude, --num_nodes and --num_gpus on 2 nodes x 2 slots: each global rank's node, and local ranks
    0..n-1 on each node. Which local rank a global rank gets is launch.py's (global rank modulo the node's count)."""
    work, out = tmp_path / "work", tmp_path / "work" / "out"
    out.mkdir(parents=True)
    hostfile = nodes.hostfile(2, work / "hostfile")
    args = ["--hostfile", str(hostfile), *filters, str(PROBE), str(out)]
    returncode, output, seconds = launch_on_node0(nodes, installed_script("deepspeed"), args, work, node_env)
    ranks = sorted((json.loads(path.read_text()) for path in out.glob("rank*.json")), key=lambda rank: rank["rank"])
    got = [(rank["node"], rank["local_rank"]) for rank in ranks]
    right = [node for node, _ in got] == [node for node, _ in placed] and sorted(got) == sorted(placed)
    _record(f"filter/{' '.join(filters)}", {"seconds": round(seconds, 1), "placed": got, "right": right})
    assert returncode == 0, output[-4000:]
    assert [node for node, _ in got] == [node for node, _ in placed], output[-4000:]
    assert sorted(got) == sorted(placed), output[-4000:]
    assert all(rank["world_size"] == len(placed) for rank in ranks)


def _outcome(expected, returncode, ranks, marker):
    if marker.exists():
        return "ran"
    if returncode != 0 or len(ranks) != 2:
        return "launch failed"
    if all({key: rank[key] for key in expected} == expected for rank in ranks):
        return "arrives"
    return "mangled"


@pytest.mark.slow
@pytest.mark.parametrize("side", ["fork", "pristine"])
@pytest.mark.parametrize("name", list(VALUES))
def test_value_table(nodes, tmp_path, name, side):
    """One value at a time, on the fork and on pristine DeepSpeed: arrives, mangled, launch failed, or ran."""
    deepspeed = _runner(side)
    marker = tmp_path / "marker"
    expected, output, returncode, ranks = probe_launch(nodes, deepspeed, tmp_path / "work", [name], marker)
    outcome = _outcome(expected, returncode, ranks, marker)
    _record(f"value/{name}/{side}", outcome)
    if side == "fork":
        assert outcome == "arrives", output[-4000:]


def test_nodes_leave_nothing_behind(tmp_path):
    """A node's processes end with it, whatever they were doing; its namespaces and links go too."""
    require_nodes()
    token = f"ds-nodes-teardown-{os.getpid()}"
    with Nodes(2, tmp_path / "nodes") as made:
        # A process the test never waits for, detached from its ssh session, on each node.
        for index in range(2):
            made.ssh(index, ["sh", "-c", 'setsid sh -c "sleep 600; : $0" "$0" </dev/null >/dev/null 2>&1 &', token],
                     timeout=30)
        assert len(subprocess.run(["pgrep", "-f", token], stdout=subprocess.PIPE).stdout.split()) == 2
        names = (made.netns, made.bridge)
    assert subprocess.run(["pgrep", "-f", token], stdout=subprocess.PIPE).returncode == 1
    listed = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, text=True).stdout
    assert not any(netns in listed for netns in names[0])
    assert subprocess.run(["ip", "link", "show", names[1]], capture_output=True).returncode != 0


def _wait_for(paths, proc, cwd, within=120):
    deadline = time.monotonic() + within
    while not all(path.exists() for path in paths):
        if proc.poll() is not None or time.monotonic() > deadline:
            output = (Path(cwd) / "runner.log").read_text(errors="replace")
            pytest.fail(f"the job never reached {[path.name for path in paths]}:\n{output[-4000:]}")
        time.sleep(0.1)


FAILURES = {
    "start": "rank 1 (node 1) exits with an error before the process group forms",
    "train": "rank 1 (node 1) killed (SIGKILL) after 20 all-reduces",
    "lost-node": "node 1 dies in training: every process of it killed at once",
    "runner-sigterm": "the runner on node 0 gets SIGTERM in training",
    "runner-sigkill": "the runner on node 0 is killed (SIGKILL) in training",
    "node-cut": "node 1 stops answering in training (its network cut, its processes running on)",
}
# What ends the runner itself in the runner-* cases.
RUNNER_SIGNALS = {"runner-sigterm": "-TERM", "runner-sigkill": "-KILL"}

_BUILT = set()


def _build_comm_op(python, extensions_dir):
    """Build the CPU all-reduce op a rank loads as the process group forms, before a trial stops ranks: a rank
    stopped in the middle of a JIT build leaves its lock behind, and every later build waits on it."""
    if python in _BUILT:
        return
    code = "from deepspeed.accelerator import get_accelerator; get_accelerator().create_op_builder('ShareMemCommBuilder').load()"
    subprocess.run([python, "-c", code],
                   env=dict(os.environ, TORCH_EXTENSIONS_DIR=str(extensions_dir)),
                   check=True,
                   timeout=900,
                   stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    _BUILT.add(python)


def _failure_params():
    for side in ("fork", "pristine"):
        for case in FAILURES:
            slow = side == "pristine" or case in ("train", "runner-sigterm", "node-cut")
            yield pytest.param(side, case, marks=[pytest.mark.slow] if slow else [], id=f"{side}-{case}")


def _left(nodes):
    """node -> how many processes of the job it still runs, for the nodes alive and reachable."""
    return {index: nodes.processes(index, JOB_PROCESSES) for index in range(nodes.count) if nodes.reachable(index)}


@pytest.mark.parametrize("side,case", _failure_params())
def test_failure_ends_the_job(tmp_path, node_env, side, case):
    """Wherever the job fails, every node's processes of it end within FULL_STOP_BOUND s (SILENT_NODE_BOUND for a node
    that stops answering), and the runner exits
    non-zero. On pristine DeepSpeed (slow) the same trials are recorded, not judged."""
    require_nodes()
    deepspeed = _runner(side)
    _build_comm_op(str(Path(deepspeed).with_name("python")), node_env["TORCH_EXTENSIONS_DIR"])
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    fail = case if case in ("start", "train") else "none"
    # The interface and the ops through .deepspeed_env, which 0.19.8 reads too (it forwards no GLOO_* or TORCH_*).
    (work / ".deepspeed_env").write_text("".join(f"{name}={value}\n" for name, value in node_env.items()))
    with Nodes(2, tmp_path / "nodes") as nodes:
        hostfile = nodes.hostfile(1, work / "hostfile")
        args = ["--hostfile", str(hostfile), "--no_local_rank", str(FAILING), str(out), "--fail", fail]
        proc = start_on_node(nodes, deepspeed, args, work, node_env)
        if case in ("start", "train"):
            _wait_for([out / "failed-at"], proc, work)
            failed_at = float((out / "failed-at").read_text())
        else:
            _wait_for([out / "training-0", out / "training-1"], proc, work)
            failed_at = time.time()
            if case == "lost-node":
                nodes.kill(1)
            elif case == "node-cut":
                nodes.cut(1)
            else:
                nodes.ssh(0, ["pkill", RUNNER_SIGNALS[case], "-f", "bin/deepspeed --hostfile"], timeout=30)
        bound = SILENT_NODE_BOUND if case == "node-cut" else FULL_STOP_BOUND
        proc_timeout = bound + (120 if side == "fork" else 0)
        returncode, output = finish(proc, work, timeout=proc_timeout, must_end=side == "fork")
        # A full stop: the runner ended and no process of the job is left on a node it can reach. What is left
        # ``bound`` s after the failure is counted before the teardown ends it.
        left = _left(nodes)
        while any(left.values()) and time.time() - failed_at < bound:
            time.sleep(0.5)
            left = _left(nodes)
        seconds = time.time() - failed_at
        _record(
            f"failure/{case}/{side}", {
                "where": FAILURES[case],
                "seconds": round(seconds, 1) if returncode is not None else None,
                "returncode": returncode,
                "left": sum(left.values())
            })
    if side == "pristine":
        return
    if case != "runner-sigkill":  # the runner killed outright has no say in its status
        assert returncode != 0, output[-4000:]
    assert seconds < bound, f"{seconds:.0f} s to a full stop:\n{output[-4000:]}"
    assert not any(left.values()), f"processes of the job left on the nodes: {left}"


# The crash trials' bound for fp32 resumed on another split (tests/test_crash_resume.py): the same sums, reordered.
FP32_REORDERED = 1e-6
# Where node 1's rank waits for the test to kill its node, and the step a restart resumes at: in step 5, after the
# save of step 4; or in the save of step 4, half of its first file written (the save of step 2 is the last whole).
LOSSES = {
    "in-training": ({
        "rank": 1,
        "where": "train",
        "step": 5,
        "phase": "forward",
        "hold": True
    }, 4),
    "in-a-save": ({
        "rank": 1,
        "where": "save",
        "save": 2,
        "file": 0,
        "fraction": 0.5,
        "hold": True
    }, 2),
}


def _uninterrupted_weights(tmp_path, extensions_dir, config):
    """The final weights of the same run on 2 ranks of this machine, never interrupted."""
    reference = launch_cases(CRASH_RESUME,
                             2,
                             timeout=900,
                             extensions_dir=extensions_dir,
                             extra_args=["--uninterrupted",
                                         str(tmp_path / "uninterrupted"), "--configs", config])
    return torch.tensor(reference.case(f"uninterrupted/{config}")[0]["weights"], dtype=torch.float64)


def _lose_node1(nodes, runner_args, config, kill, work, node_env, cut=False):
    """Start crash_resume.py's kill run on 2 nodes x 1 rank (``runner_args`` first), kill node 1 (or, with ``cut``,
    cut it off) once its rank waits where ``kill`` (a LOSSES entry) says, and let the runner end. -> (return code,
    output, seconds from the loss to the runner's end, processes left)."""
    deepspeed = installed_script("deepspeed")
    _build_comm_op(str(Path(deepspeed).with_name("python")), node_env["TORCH_EXTENSIONS_DIR"])
    killed_at = work / "killed-at"
    args = [
        "--hostfile",
        str(nodes.hostfile(1, work / "hostfile")), *runner_args,
        str(CRASH_RESUME), "--kill-run",
        str(work / "checkpoints"), "--config", config, "--kill",
        json.dumps(kill), "--killed-at",
        str(killed_at), "--finished",
        str(work / "finished"), "--resume-latest"
    ]
    proc = start_on_node(nodes, deepspeed, args, work, node_env)
    _wait_for([killed_at], proc, work, within=LAUNCH_TIMEOUT)
    lost_at = time.time()
    if cut:
        nodes.cut(1)
    else:
        nodes.kill(1)
    returncode, output = finish(proc, work, timeout=LAUNCH_TIMEOUT + SILENT_NODE_BOUND)
    return returncode, output, time.time() - lost_at, _left(nodes)


def _final_error(expected, weights, config):
    error = relative_error(expected, torch.tensor(weights, dtype=torch.float64))
    return error, TOLERANCE[dtype_of(config)] or FP32_REORDERED


@pytest.mark.parametrize("config,loss", [
    pytest.param("zero1_fp32_clip", "in-training", marks=pytest.mark.slow),
    pytest.param("zero3_fp32_clip", "in-training", marks=pytest.mark.slow),
    pytest.param("zero1_fp32_clip", "in-a-save", marks=pytest.mark.slow),
    pytest.param("zero3_fp32_clip", "in-a-save", marks=pytest.mark.slow),
])
def test_lost_node_then_resume_on_the_survivor(tmp_path, node_env, extensions_dir, config, loss):
    """2 nodes x 1 rank train 6 steps of one global batch, saving every 2 steps on storage both nodes share
    (tests/workers/crash_resume.py); node 1 dies in step 5 or in the save of step 4 (LOSSES). The job ends; started
    again on node 0 alone, the script loads ``latest`` with ``reshard_on_load`` (2 ranks' files on 1), resumes at the
    last save both ranks finished and ends with the weights of the same run never interrupted on 2 ranks, within
    another split's rounding."""
    require_nodes()
    expected = _uninterrupted_weights(tmp_path, extensions_dir, config)
    work, resumed = tmp_path / "work", tmp_path / "resumed"
    work.mkdir()
    resumed.mkdir()
    with Nodes(2, tmp_path / "nodes") as nodes:
        returncode, output, ended, left = _lose_node1(nodes, [], config, LOSSES[loss][0], work, node_env)
        args = [
            "--hostfile",
            str(work / "hostfile"), "--include", "node0",
            str(CRASH_RESUME), "--resume", f"lost-node:{config}={work / 'checkpoints'}", "--results-dir",
            str(resumed)
        ]
        resume_code, resume_output, resume_seconds = launch_on_node0(nodes, installed_script("deepspeed"), args, work,
                                                                     node_env)
    assert returncode != 0 and ended < FULL_STOP_BOUND and not any(left.values()), (ended, left, output[-4000:])
    assert resume_code == 0, resume_output[-4000:]
    outcome = json.loads((resumed / "rank0.json").read_text())[f"resume-lost-node/{config}"]
    assert outcome["ok"], outcome.get("error")
    got = outcome["value"]
    error, tolerance = _final_error(expected, got["weights"], config)
    _record(
        f"lost-node-resume/{loss}/{config}", {
            "job_ended_seconds": round(ended, 1),
            "left": sum(left.values()),
            "resumed_at": got["resumed_at"],
            "resume_seconds": round(resume_seconds, 1),
            "final_weights_relative_error": error
        })
    assert got["resumed_at"] == LOSSES[loss][1], got["resumed_at"]
    assert got["final_state"]["global_steps"] == 6
    assert error <= tolerance, f"final weights {error:.3g} from the uninterrupted run's (tolerance {tolerance})"


@pytest.mark.parametrize("how", ["killed", pytest.param("cut", marks=pytest.mark.slow)])
def test_lost_node_then_the_runner_restarts_on_the_survivor(tmp_path, node_env, extensions_dir, how):
    """As above, with ``deepspeed --max_restarts 1``: after node 1 dies (or stops answering: ssh's keepalives notice)
    the runner finds that only node 0 answers and starts the job again there by itself; the script, which loads
    ``latest`` as it starts, resumes at step 4 on 1 rank and ends with the uninterrupted run's weights."""
    require_nodes()
    config = "zero1_fp32_clip"
    expected = _uninterrupted_weights(tmp_path, extensions_dir, config)
    work = tmp_path / "work"
    work.mkdir()
    with Nodes(2, tmp_path / "nodes") as nodes:
        returncode, output, seconds, left = _lose_node1(nodes, ["--max_restarts", "1"],
                                                        config,
                                                        LOSSES["in-training"][0],
                                                        work,
                                                        node_env,
                                                        cut=how == "cut")
    assert returncode == 0, output[-4000:]
    assert "not answering over ssh: node1" in output, output[-4000:]
    ended = json.loads((work / "finished").read_text())
    error, tolerance = _final_error(expected, ended["weights"], config)
    _record(
        f"lost-node-restart/{how}-in-training/{config}", {
            "seconds_to_the_end": round(seconds, 1),
            "left": sum(left.values()),
            "resumed_at": ended["resumed_at"],
            "world_size": ended["world_size"],
            "final_weights_relative_error": error
        })
    assert (ended["resumed_at"], ended["world_size"]) == (4, 1), ended
    assert not any(left.values()), left
    assert error <= tolerance, f"final weights {error:.3g} from the uninterrupted run's (tolerance {tolerance})"


LOST_NODE_TRIALS = 8


@pytest.fixture(scope="module")
def uninterrupted_runs(tmp_path_factory, extensions_dir):
    """config -> (its uninterrupted run's final weights, the files each of its saves wrote on rank 1), run once."""
    runs = {}

    def run(config):
        if config not in runs:
            reference = launch_cases(
                CRASH_RESUME,
                2,
                timeout=900,
                extensions_dir=extensions_dir,
                extra_args=["--uninterrupted",
                            str(tmp_path_factory.mktemp(config)), "--configs", config])
            ranks = reference.case(f"uninterrupted/{config}")
            runs[config] = (torch.tensor(ranks[0]["weights"], dtype=torch.float64), ranks[1]["files_per_save"])
        return runs[config]

    return run


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(LOST_NODE_TRIALS))
def test_lost_node_trial(seed, uninterrupted_runs, tmp_path, node_env):
    """Seeded trials, drawn as tests/test_crash_resume.py draws its kill trials (a configuration; a step and phase of
    training, or a file of a save and how much of it was written), node 1 lost there, killed or cut off the
    network. ``--max_restarts 1`` restarts the job on node 0, which resumes at the last save both ranks finished and
    ends with the uninterrupted run's weights, within the configuration's tolerance for another split."""
    from test_crash_resume import config_of, draw, resumable_at, where
    require_nodes()
    config = config_of(seed)
    expected, files_per_save = uninterrupted_runs(config)
    trial = draw(seed, [files_per_save, files_per_save])
    trial["kill"].update(rank=1, hold=True)
    cut = seed % 2 == 1
    work = tmp_path / "work"
    work.mkdir()
    with Nodes(2, tmp_path / "nodes") as nodes:
        returncode, output, seconds, left = _lose_node1(nodes, ["--max_restarts", "1"],
                                                        config,
                                                        trial["kill"],
                                                        work,
                                                        node_env,
                                                        cut=cut)
    name = f"trial {seed} ({config}; node 1 {'cut off' if cut else 'killed'}: {where(trial)})"
    assert returncode == 0, f"{name}:\n{output[-4000:]}"
    ended = json.loads((work / "finished").read_text())
    error, tolerance = _final_error(expected, ended["weights"], config)
    _record(
        f"lost-node-trial/{seed}", {
            "where": name,
            "seconds_to_the_end": round(seconds, 1),
            "left": sum(left.values()),
            "resumed_at": ended["resumed_at"],
            "expected_resume_at": sorted(resumable_at(trial)),
            "final_weights_relative_error": error
        })
    assert ended["world_size"] == 1 and ended["resumed_at"] in resumable_at(trial), (name, ended["resumed_at"])
    assert not any(left.values()), (name, left)
    assert error <= tolerance, f"{name}: final weights {error:.3g} from the uninterrupted run's, over {tolerance}"
