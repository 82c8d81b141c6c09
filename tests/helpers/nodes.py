# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Several nodes on this machine, for the launcher's multi-node paths: each a network namespace on one bridge, with
its own hostname, process and mount namespaces (one node's processes are not another's), an sshd, and root's
~/.ssh and /etc/hosts of a cluster where every node reaches every other by name without a password.

    with Nodes(2, tmp_path) as nodes:
        nodes.ssh(0, ["deepspeed", "--hostfile", ...], timeout=300)

Traffic goes only to the addresses of the namespaces made here. Everything is torn down by PID and by name on exit,
whatever the test did.
"""

import itertools
import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

# The interface each node reaches the others through: the same name on every node, as on a real cluster.
NODE_INTERFACE = "dseth0"
PACKAGES = {
    "sshd": "openssh-server",
    "ssh": "openssh-client",
    "pdsh": "pdsh",
    "ip": "iproute2",
    "unshare": "util-linux"
}
SSHD = "/usr/sbin/sshd"

SSHD_CONFIG = """Port 22
ListenAddress {address}
HostKey {dir}/host_key
AuthorizedKeysFile {dir}/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile none
"""
SSH_CONFIG = """Host *
  IdentityFile {identity}
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
  BatchMode yes
  ConnectTimeout 10
"""
# Each node's sshd runs as the first process of its own hostname, process and mount namespaces; these arguments
# arrive as $1.. and are never part of the script.
# A /dev/shm of its own, as each machine has: DeepSpeed's CPU all-reduce buffers there are named per node.
NODE_INIT = ('hostname "$1" && mount --bind "$2" /etc/hosts && mkdir -p /root/.ssh && mount --bind "$3" /root/.ssh '
             '&& mount -t tmpfs tmpfs /dev/shm && exec "$4" -D -e -f "$5"')


def missing_tools():
    """What this machine lacks to make nodes (Debian packages, or root); [] when it can."""
    found = {tool: Path(SSHD).exists() if tool == "sshd" else shutil.which(tool) for tool in PACKAGES}
    lacking = sorted({PACKAGES[tool] for tool, there in found.items() if not there})
    return lacking + ([] if os.geteuid() == 0 else ["root"])


def require_nodes():
    """Skip where nodes cannot be made; fail instead where DS_GAFIX_REQUIRE_MULTINODE=1 (CI installs the tools)."""
    lacking = missing_tools()
    if lacking:
        message = f"multi-node tests need {', '.join(lacking)}"
        if os.environ.get("DS_GAFIX_REQUIRE_MULTINODE") == "1":
            pytest.fail(message)
        pytest.skip(message)


_SERIAL = itertools.count()


def _run(cmd):
    subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)


class Nodes:

    def __init__(self, count, root):
        self.count = count
        self.root = Path(root)
        # Names and a subnet no other set of nodes on this machine has: this process's id and its count of sets.
        serial = next(_SERIAL)
        tag = f"{os.getpid() % 100000}x{serial % 100}"
        self.netns = [f"dsnode{tag}-{index}" for index in range(count)]
        self.bridge = f"dsbr{tag}"
        self.host_ends = [f"dsv{tag}n{index}" for index in range(count)]
        subnet = 16 + (os.getpid() * 7 + serial) % 200
        self.addresses = [f"10.231.{subnet}.{index + 1}" for index in range(count)]
        self.host_address = f"10.231.{subnet}.254"
        self.names = [f"node{index}" for index in range(count)]
        self.sshd = []
        self.cut_off = set()

    # The cluster's files: host and client keys, sshd's and ssh's configuration, /etc/hosts.
    def _write_files(self):
        self.root.mkdir(parents=True, exist_ok=True)
        self.ssh_dir = self.root / "dot-ssh"
        self.ssh_dir.mkdir(exist_ok=True)
        for key in ("host_key", "client_key"):
            if not (self.root / key).exists():
                _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.root / key)])
        shutil.copy(self.root / "client_key.pub", self.root / "authorized_keys")
        shutil.copy(self.root / "client_key", self.ssh_dir / "id_ed25519")
        # Inside a node ~/.ssh is this directory; the test itself names the key by its path.
        (self.ssh_dir / "config").write_text(SSH_CONFIG.format(identity="~/.ssh/id_ed25519"))
        (self.root / "ssh_config").write_text(SSH_CONFIG.format(identity=self.root / "client_key"))
        os.chmod(self.ssh_dir, 0o700)
        for path in (self.ssh_dir / "id_ed25519", self.root / "client_key"):
            os.chmod(path, 0o600)
        hosts = ["127.0.0.1 localhost"] + [f"{address} {name}" for address, name in zip(self.addresses, self.names)]
        (self.root / "hosts").write_text("\n".join(hosts) + "\n")
        for index, address in enumerate(self.addresses):
            (self.root / f"sshd_config_{index}").write_text(SSHD_CONFIG.format(address=address, dir=self.root))

    def _network(self):
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", f"{self.host_address}/24", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        for netns, host_end, address in zip(self.netns, self.host_ends, self.addresses):
            _run(["ip", "netns", "add", netns])
            _run(["ip", "link", "add", host_end, "type", "veth", "peer", "name", NODE_INTERFACE, "netns", netns])
            _run(["ip", "link", "set", host_end, "master", self.bridge])
            _run(["ip", "link", "set", host_end, "up"])
            inside = ["ip", "netns", "exec", netns, "ip"]
            _run(inside + ["addr", "add", f"{address}/24", "dev", NODE_INTERFACE])
            _run(inside + ["link", "set", NODE_INTERFACE, "up"])
            _run(inside + ["link", "set", "lo", "up"])

    def _start_sshd(self):
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
        for index, netns in enumerate(self.netns):
            log = open(self.root / f"sshd_{index}.log", "wb")
            self.sshd.append(
                subprocess.Popen([
                    "ip", "netns", "exec", netns, "unshare", "--uts", "--pid", "--mount", "--fork", "--mount-proc",
                    "--kill-child", "sh", "-c", NODE_INIT, "node-init", self.names[index],
                    str(self.root / "hosts"),
                    str(self.ssh_dir), SSHD,
                    str(self.root / f"sshd_config_{index}")
                ],
                                 stdout=log,
                                 stderr=subprocess.STDOUT,
                                 start_new_session=True))
            log.close()
        deadline = time.monotonic() + 30
        for index in range(self.count):
            while self.ssh(index, ["hostname"], timeout=15, check=False).returncode != 0:
                if self.sshd[index].poll() is not None or time.monotonic() > deadline:
                    log = (self.root / f"sshd_{index}.log").read_text(errors="replace")
                    raise RuntimeError(f"node {index}'s sshd did not answer:\n{log[-2000:]}")
                time.sleep(0.2)

    def __enter__(self):
        try:
            self._write_files()
            self._network()
            self._start_sshd()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Every node's processes end with its sshd (the first process of its PID namespace); then its network."""
        for proc in self.sshd:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        for netns in self.netns:
            subprocess.run(["ip", "netns", "del", netns], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        subprocess.run(["ip", "link", "del", self.bridge], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def kill(self, index):
        """Node ``index`` dies at once: its sshd, the first process of its process namespace, is killed with every
        process of the node; its network stays, as a switch port would."""
        proc = self.sshd[index]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def cut(self, index):
        """Node ``index`` stops answering without a word, as when its power or its cable goes: its interface goes
        down, so what is sent to it is dropped, never refused; its processes run on, cut off."""
        _run(["ip", "netns", "exec", self.netns[index], "ip", "link", "set", NODE_INTERFACE, "down"])
        self.cut_off.add(index)

    def alive(self, index):
        return self.sshd[index].poll() is None

    def reachable(self, index):
        return self.alive(index) and index not in self.cut_off

    def processes(self, index, pattern):
        """How many processes of node ``index`` have a command line matching ``pattern`` (pgrep -f)."""
        found = self.ssh(index, ["pgrep", "-f", pattern], timeout=30, check=False)
        return len(found.stdout.split()) if found.returncode == 0 else 0

    def ssh_command(self, index, argv):
        """ssh to node ``index`` running ``argv``, each word quoted for its shell."""
        return ["ssh", "-F", str(self.root / "ssh_config"), self.addresses[index], shlex.join(argv)]

    def ssh(self, index, argv, timeout, check=True, **kwargs):
        return subprocess.run(self.ssh_command(index, argv),
                              timeout=timeout,
                              check=check,
                              stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT,
                              **kwargs)

    def hostfile(self, slots, path):
        Path(path).write_text("".join(f"{name} slots={slots}\n" for name in self.names))
        return path
