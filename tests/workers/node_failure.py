# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""A rank of a multi-node job that all-reduces until stopped, one rank of which fails where it is told.

    node_failure.py OUT --fail {none,start,train} [--failing-rank R]

Every rank writes OUT/started-<rank> (its node and pid) once it runs, and OUT/training-<rank> after its first
all-reduce. With ``--fail start`` rank R exits with an
error before the process group forms (the others wait for it in the rendezvous); with ``--fail train`` it kills
itself with SIGKILL after 20 all-reduces. The failing rank writes OUT/failed-at (the time) first.
"""

import argparse
import json
import os
import signal
import socket
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--fail", choices=["none", "start", "train"], default="none")
parser.add_argument("--failing-rank", type=int, default=1)
args = parser.parse_args()
rank = int(os.environ["RANK"])
failing = args.fail != "none" and rank == args.failing_rank


def fail(how):
    with open(os.path.join(args.out, "failed-at"), "w") as out:
        out.write(str(time.time()))
    how()


with open(os.path.join(args.out, f"started-{rank}"), "w") as out:
    json.dump({"node": socket.gethostname(), "pid": os.getpid()}, out)
if failing and args.fail == "start":
    fail(lambda: sys.exit(3))

import torch  # noqa: E402
import deepspeed  # noqa: E402
import deepspeed.comm as dist  # noqa: E402

deepspeed.init_distributed(dist_backend="gloo")
step = 0
while True:
    tensor = torch.ones(4)
    dist.all_reduce(tensor)
    step += 1
    if step == 1:
        open(os.path.join(args.out, f"training-{rank}"), "w").close()
    if failing and args.fail == "train" and step == 20:
        fail(lambda: os.kill(os.getpid(), signal.SIGKILL))
    time.sleep(0.05)
