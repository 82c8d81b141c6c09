# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The fork and pristine upstream on one machine, one default JIT cache (patch
JIT-build-each-op-under-a-name-keyed-by-its-sources).

Both JIT-build an op named ``deepspeed_shm_comm`` from different sources (patch
Remove-the-CPU-shm-all-reduce-buffers-names-once-all adds ``release_shm_names``). Sharing one cache directory, each
switch rebuilt the op and a fork process could load the pristine binary. Here both installs load the op with default
settings (no TORCH_EXTENSIONS_DIR; HOME is a scratch directory): alternating, then at the same time, each loads its own
binary and none is rebuilt.

The default cache starts with both installs' builds, copied from the run's extensions directory, where other launches
of the run built them (the demo, test_checkpoint_swap's pristine launches; the fixture builds what is missing): two JIT
builds less (about 100 s of CI's budget). Under one shared name (0.19.8 on both sides) the copies would be one
directory, and the checks fail as they did before patch JIT-build-each-op-under-a-name-keyed-by-its-sources.
``--run-slow`` adds the first builds themselves, both at the same time into an empty default cache.
"""

import json
import os
import shutil
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


def start_load(python, home, extensions_dir=None):
    """Load the op in a new process: default settings under ``home``, or from ``extensions_dir``."""
    env = default_settings_env(home)
    if extensions_dir is not None:
        env["TORCH_EXTENSIONS_DIR"] = str(extensions_dir)
    return subprocess.Popen([python, "-c", LOAD_OP],
                            cwd=home,
                            env=env,
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


@pytest.fixture(scope="module")
def installs():
    return {"fork": sys.executable, "pristine": pristine_python()}


def default_cache(python, home):
    """The directory torch's JIT builds into with default settings (HOME as given)."""
    probe = subprocess.run([
        python, "-c", "from torch.utils.cpp_extension import _get_build_directory as d; "
        "print(d('gafix_probe', verbose=False))"
    ],
                           env=default_settings_env(home),
                           stdout=subprocess.PIPE,
                           text=True,
                           check=True).stdout.strip().splitlines()[-1]
    Path(probe).rmdir()  # it made the op's directory
    return Path(probe).parent


def both_load(installs, home, extensions_dir=None):
    """Both installs load the op at the same time (2 cores: half the wait of one after the other)."""
    running = {who: start_load(python, home, extensions_dir) for who, python in installs.items()}
    return {who: finish_load(proc, who) for who, proc in running.items()}


def assert_own_binaries(first, binaries):
    assert first["fork"]["release_shm_names"] and not first["pristine"]["release_shm_names"]
    assert Path(first["fork"]["file"]).parent != Path(first["pristine"]["file"]).parent, \
        "the fork and pristine built the op into the same cache directory"
    assert sorted(binaries) == sorted({first["fork"]["file"], first["pristine"]["file"]})


def test_fork_and_pristine_share_the_default_cache(tmp_path, installs, extensions_dir):
    home = tmp_path / "home"
    home.mkdir()
    built = both_load(installs, home, extensions_dir)  # in the run's extensions dir: built there already in CI
    cache = default_cache(installs["fork"], home)
    for loaded in built.values():
        # copy2 keeps the files' times, so torch's ninja finds the copies up to date.
        shutil.copytree(Path(loaded["file"]).parent, cache / Path(loaded["file"]).parent.name)
    assert_switching_neither_crashes_nor_rebuilds(installs, home, seeded=built_binaries(home))


@pytest.mark.slow
def test_first_builds_into_an_empty_default_cache(tmp_path, installs):
    home = tmp_path / "home"
    home.mkdir()
    assert_switching_neither_crashes_nor_rebuilds(installs, home)


def assert_switching_neither_crashes_nor_rebuilds(installs, home, seeded=None):
    """Both load at the same time (building what the default cache lacks, each into its own
    directory), then one after the other, then at the same time again: each loads its own binary and,
    after its first build, none is built again."""
    first = both_load(installs, home)
    binaries = built_binaries(home)
    assert_own_binaries(first, binaries)
    if seeded is not None:
        assert binaries == seeded, "a copied build was rebuilt"

    for who in ("fork", "pristine", "fork"):  # alternating: each loads its own binary, none is rebuilt
        again = finish_load(start_load(installs[who], home), who)
        assert again == first[who], f"{who} loaded {again['file']}, not its own {first[who]['file']}"
        assert built_binaries(home) == binaries, f"switching to {who} rebuilt an op"

    assert both_load(installs, home) == first  # at the same time
    assert built_binaries(home) == binaries, "concurrent launches rebuilt an op"
