# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Virtual environments the tools build (pristine's, a version-matrix cell's, a CUDA build cell's): an interpreter of
a Python version, a venv on it, pip into it, each step logged."""

import os
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

from toolkit import REPO, locks
from toolkit.logs import run_logged


class NoInterpreter(RuntimeError):
    """No working interpreter of the Python version asked for."""


def interpreter(python_version):
    """An interpreter of that Python version (``"3.12"``): python3.X on PATH, else one pyenv installed (pyenv's shims
    on PATH answer only for the versions it has enabled)."""
    candidates = [shutil.which(f"python{python_version}")]
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates += sorted(map(str, pyenv_root.glob(f"versions/{python_version}.*/bin/python{python_version}")))
    for candidate in filter(None, candidates):
        probe = subprocess.run([candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                               stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL,
                               text=True)
        if probe.returncode == 0 and probe.stdout.strip() == python_version:
            return candidate
    raise NoInterpreter(f"no working python{python_version} (on PATH or under pyenv)")


def python_of(venv):
    return Path(venv) / "bin" / "python"


@contextmanager
def building(venv):
    """Held while one process checks for and builds ``venv``: two test processes (pytest-xdist's workers) that
    want the same venv at once would otherwise both build it, each deleting what the other installs; the second
    waits, then finds it built. Released when the process ends, however it ends."""
    with locks.exclusive(Path(venv).with_name(Path(venv).name + ".lock")):
        yield


def create(venv, base_python, log, env=None, cwd=None):
    """A venv at ``venv`` on ``base_python``, unless one is there; the exit status (0 when it was there)."""
    if python_of(venv).exists():
        return 0
    return run_logged([base_python, "-m", "venv", venv], log, env, cwd)[0]


def pip_install(venv, args, log, env=None, cwd=None, timeout=None):
    """``pip install -q ARGS`` in ``venv``; ``(returncode, seconds)``."""
    return run_logged([python_of(venv), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
                      log,
                      env,
                      cwd,
                      timeout=timeout)


def has_layer(venv):
    """Whether ``venv`` imports the maintainers' layer (toolkit and the tools' modules)."""
    return subprocess.run([python_of(venv), "-c", "import toolkit"],
                          stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode == 0


def install_layer(venv, log, env=None):
    """``pip install -e tools`` in ``venv``: the tests and the benchmarks import the layer in every environment they
    run in (tools/pyproject.toml); ``(returncode, seconds)``."""
    return pip_install(venv, ["--no-deps", "-e", REPO / "tools"], log, env)
