# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Reports, as OUT/rank<RANK>.json, what this rank received from the launcher: its node, its arguments, the
environment variables named ``*DS_PROBE_*`` and its working directory. No process group.

    node_probe.py OUT [ARG ...]
"""

import json
import os
import socket
import sys

args = sys.argv[2:] if sys.argv[1].startswith("--local_rank=") else sys.argv[1:]
report = {
    "node": socket.gethostname(),
    "rank": int(os.environ["RANK"]),
    "local_rank": int(os.environ["LOCAL_RANK"]),
    "world_size": int(os.environ["WORLD_SIZE"]),
    "argv": args[1:],
    "env": {
        name: value
        for name, value in os.environ.items() if "DS_PROBE_" in name
    },
    "cwd": os.getcwd(),
}
with open(os.path.join(args[0], f"rank{report['rank']}.json"), "w") as out:
    json.dump(report, out)
