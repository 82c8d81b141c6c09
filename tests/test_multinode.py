# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The ``deepspeed`` launcher across nodes for real: nodes made on this machine (tests/helpers/nodes.py: a network
namespace, hostname, process and mount namespaces and an sshd each), the runner started on node 0 as a user logged
in there starts it, reaching every node through pdsh and ssh.

- The demo (examples/gas_demo.py) across 2 nodes agrees with its fp64 reference.
- Every value the runner passes to the other nodes (script arguments, forwarded variables, .deepspeed_env lines)
  arrives byte for byte and is never run (tests/helpers/shell_values.py's table).

``DS_GAFIX_MULTINODE_JSON=FILE`` writes each case's outcome and time there (the slow table of values runs the same
launch on pristine DeepSpeed too).
"""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from helpers.launch import installed_script
from helpers.nodes import NODE_INTERFACE, Nodes, require_nodes
from helpers.repo import REPO
from helpers.shell_values import NOT_IN_ENV_FILE, VALUES, filled

DEMO = REPO / "examples" / "gas_demo.py"
PROBE = REPO / "tests" / "workers" / "node_probe.py"
LAUNCH_TIMEOUT = 300


def _record(case, outcome):
    path = os.environ.get("DS_GAFIX_MULTINODE_JSON")
    if not path:
        return
    results = json.loads(Path(path).read_text()) if Path(path).exists() else {}
    results[case] = outcome
    Path(path).write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


def launch_on_node0(nodes, deepspeed, args, cwd, env=None, timeout=LAUNCH_TIMEOUT):
    """The runner ``deepspeed args`` started on node 0 in ``cwd``, as a user logged in there starts it.

    -> (return code, output, seconds). A launch past ``timeout`` fails the test; the nodes' teardown ends it.
    """
    env_words = [f"{name}={value}" for name, value in (env or {}).items()]
    argv = ["sh", "-c", 'cd "$1" && shift && exec "$@"', "launch", str(cwd), "env", *env_words, deepspeed, *args]
    started = time.monotonic()
    proc = subprocess.Popen(nodes.ssh_command(0, argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"launch did not end in {timeout} s:\n{out.decode(errors='replace')[-4000:]}")
    return proc.returncode, out.decode(errors="replace"), time.monotonic() - started


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
    returncode, output, seconds = launch_on_node0(nodes, installed_script("deepspeed"), args, REPO, node_env)
    agrees = returncode == 0 and ": AGREE" in output
    _record(f"demo/zero{stage}/2x{slots}", {"seconds": round(seconds, 1), "agrees": agrees})
    assert agrees, output[-4000:]
    assert f"{2 * slots} rank(s), ZeRO stage {stage}" in output


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
    if side == "pristine":
        from helpers.pristine import pristine_python
        deepspeed = str(Path(pristine_python()).with_name("deepspeed"))
    else:
        deepspeed = installed_script("deepspeed")
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
