# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The installed ``ds_gas_check`` command, run as a user runs it."""

import os
import subprocess
import sys
from pathlib import Path

from helpers.repo import REPO


def ds_gas_check(args, extensions_dir, cwd=None, timeout=900):
    """Run ``ds_gas_check args``; its ranks build ops in ``extensions_dir`` and import this tests directory's modules
    (``--model helpers.<module>:<factory>``)."""
    command = Path(sys.executable).with_name("ds_gas_check")
    path = os.pathsep.join(filter(None, [str(REPO / "tests"), os.environ.get("PYTHONPATH")]))
    return subprocess.run([str(command), *args],
                          stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE,
                          text=True,
                          timeout=timeout,
                          cwd=cwd,
                          env=dict(os.environ, TORCH_EXTENSIONS_DIR=str(extensions_dir), PYTHONPATH=path))
