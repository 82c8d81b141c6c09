# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The fork and pristine upstream on one machine, one default JIT cache (patch 0011).

Both JIT-build an op named ``deepspeed_shm_comm`` from different sources (patch 0002 adds
``release_shm_names``). Sharing one cache directory, each switch rebuilt the op and a fork process
could load the pristine binary. Here both installs load the op with default settings (no
TORCH_EXTENSIONS_DIR; HOME is a scratch directory, so the default cache is empty at first),
building at the same time, then alternating, then loading at the same time: each builds once, never
rebuilds, and loads its own binary.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.pristine import pristine_python

pytestmark = pytest.mark.fork_only

LOAD_OP = """
import json
from deepspeed.accelerator import get_accelerator
op = get_accelerator().create_op_builder("ShareMemCommBuilder").load(verbose=False)
print("LOADED " + json.dumps({"file": op.__file__, "release_shm_names": hasattr(op, "release_shm_names")}))
"""


def default_settings_env(home):
    env = {key: value for key, value in os.environ.items() if key not in ("TORCH_EXTENSIONS_DIR", "XDG_CACHE_HOME")}
    env["HOME"] = str(home)
    return env


def start_load(python, home):
    return subprocess.Popen([python, "-c", LOAD_OP],
                            cwd=home,
                            env=default_settings_env(home),
                            stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT,
                            text=True)


def finish_load(proc, who):
    out, _ = proc.communicate(timeout=900)
    loaded = [line for line in out.splitlines() if line.startswith("LOADED ")]
    assert proc.returncode == 0 and loaded, f"{who} failed to load the shm comm op:\n{out[-3000:]}"
    return json.loads(loaded[-1][len("LOADED "):])


def built_binaries(home):
    """Every .so under the default cache, with its modification time (a rebuild changes it)."""
    root = Path(home) / ".cache" / "torch_extensions"
    return {str(path): path.stat().st_mtime_ns for path in root.rglob("*.so")}


def test_fork_and_pristine_share_the_default_cache(tmp_path):
    installs = {"fork": sys.executable, "pristine": pristine_python()}
    home = tmp_path / "home"
    home.mkdir()

    # The first builds run at the same time (2 cores: half the wait), each into its own directory.
    building = {who: start_load(python, home) for who, python in installs.items()}
    first = {who: finish_load(proc, who) for who, proc in building.items()}
    assert first["fork"]["release_shm_names"] and not first["pristine"]["release_shm_names"]
    assert Path(first["fork"]["file"]).parent != Path(first["pristine"]["file"]).parent, \
        "the fork and pristine built the op into the same cache directory"
    binaries = built_binaries(home)
    assert sorted(binaries) == sorted({first["fork"]["file"], first["pristine"]["file"]})

    for who in ("fork", "pristine", "fork"):  # alternating: each loads its own binary, none is rebuilt
        again = finish_load(start_load(installs[who], home), who)
        assert again == first[who], f"{who} loaded {again['file']}, not its own {first[who]['file']}"
        assert built_binaries(home) == binaries, f"switching to {who} rebuilt an op"

    running = {who: start_load(python, home) for who, python in installs.items()}  # at the same time
    for who, proc in running.items():
        assert finish_load(proc, who) == first[who]
    assert built_binaries(home) == binaries, "concurrent launches rebuilt an op"
