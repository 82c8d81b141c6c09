# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Start N ranks of a script on this machine as ``deepspeed --num_gpus N --no_local_rank`` does, without its
two torch-importing processes.

``deepspeed`` (runner.py) starts ``python -m deepspeed.launcher.launch``, which starts the ranks; each of the
two imports deepspeed, and so torch, only to set a few variables, which costs more than a small case. Here one
Python process with no torch sets the same variables (``RANK_VARIABLES``, as runner.py and launch.py set them
for one node on the CPU accelerator) and supervises the ranks as launch.py does: when one exits non-zero, the
others and their children are terminated (killed after 30 s) and this process exits with that rank's code;
SIGINT or SIGTERM does the same. ``tests/test_launch.py`` compares what the ranks see with the launcher's.

    python local_ranks.py --nprocs 2 --master_port 29500 script.py [script args...]
"""

import argparse
import os
import signal
import subprocess
import sys
import time

import psutil  # a requirement of deepspeed, so in every environment that runs its ranks

POLL_SECONDS = 0.2
TERMINATE_GRACE_SECONDS = 30  # launch.py's


def rank_variables(rank, nprocs, master_port):
    """What deepspeed's launcher sets for ``rank`` of ``nprocs`` on one node (runner.py picks 127.0.0.1 when no
    hostfile names other nodes; launch.py sets the rest, the CPU accelerator's visible devices included)."""
    return {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(master_port),
        "WORLD_SIZE": str(nprocs),
        "CROSS_RANK": "0",
        "CROSS_SIZE": "1",
        "LOCAL_SIZE": str(nprocs),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "CUDA_VISIBLE_DEVICES": ",".join(map(str, range(nprocs))),
    }


RANK_VARIABLES = tuple(rank_variables(0, 1, 0))


def terminate(processes):
    """launch.py's ``terminate_process_tree`` for each process: SIGTERM to it and its children, SIGKILL to what
    is still alive after the grace period."""
    tree = []
    for process in processes:
        try:
            parent = psutil.Process(process.pid)
            tree += parent.children(recursive=True) + [parent]
        except psutil.NoSuchProcess:
            pass
    for member in tree:
        try:
            member.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(tree, timeout=TERMINATE_GRACE_SECONDS)
    for member in alive:
        try:
            member.kill()
        except psutil.NoSuchProcess:
            pass


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, required=True)
    parser.add_argument("--master_port", type=int, required=True)
    parser.add_argument("script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)

    ranks = []
    for rank in range(args.nprocs):
        env = dict(os.environ, **rank_variables(rank, args.nprocs, args.master_port))
        ranks.append(subprocess.Popen([sys.executable, "-u", args.script, *args.script_args], env=env))

    def stop(signum, frame):
        terminate(ranks)
        sys.exit(1)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)

    running = list(ranks)
    while running:
        for process in list(running):
            code = process.poll()
            if code is None:
                continue
            running.remove(process)
            if code != 0:
                terminate(running)
                print(f"local_ranks: rank {ranks.index(process)} exited with {code}; the others were terminated",
                      file=sys.stderr,
                      flush=True)
                return code if code > 0 else 128 - code
        time.sleep(POLL_SECONDS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
