# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The two sides every comparison runs: the fork (the interpreter running, or one given) and pristine upstream.

Pristine upstream lives in a venv of its own that follows the torch and Python of the fork it is compared with:
the same torch version and build (2.14.1+cu130 is not 2.14.1+cpu), so a difference between the two sides is the
fork's, never the torch's. One venv per (version, Python, torch): build/upstream-venv-VERSION-pyX.Y-torchT, or under
$DS_GAFIX_VENV_DIR.
"""

import os
import shutil
import subprocess
import sys

from toolkit import REPO, venvs
from gafix_build import load_pin

PROBE = 'import sys, torch; print("%d.%d" % sys.version_info[:2], torch.__version__, ' \
        'getattr(sys, "_base_executable", sys.executable))'


class PristineNotFound(RuntimeError):
    """No pristine interpreter could be built or found."""


def upstream_version():
    """The upstream release the fork is built on (upstream.json)."""
    return load_pin(REPO).version


def pristine_venv(version=None, like=None):
    """The venv with pristine upstream ``version`` on ``like``'s torch and Python (default: this interpreter's),
    built on first use (about a minute; longer for a CUDA torch), its steps logged beside it; its directory."""
    version = version or upstream_version()
    like = like or sys.executable
    probe = subprocess.run([like, "-c", PROBE], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    found = probe.stdout.strip().splitlines()[-1:]
    if probe.returncode or len(found[0].split() if found else ()) != 3:
        raise PristineNotFound(f"{like} cannot import torch: name an interpreter with torch (--like PYTHON)")
    python_version, torch_version, base_python = found[0].split()
    venv = (REPO / os.environ.get("DS_GAFIX_VENV_DIR", "build") /
            f"upstream-venv-{version}-py{python_version}-torch{torch_version}").absolute()
    python = venvs.python_of(venv)
    with venvs.building(venv):
        if not (venv / "bin" / "pytest").exists():
            _build_pristine(venv, version, torch_version, python_version, base_python, like)
        elif not venvs.has_layer(venv):  # built before the layer was an installed package
            if venvs.install_layer(venv, venv.with_name(venv.name + ".log"), clean_environ())[0]:
                raise PristineNotFound(f"installing tools/ (the maintainers' layer) into {venv} failed")
    # deepspeed logs to stdout on import: the answer is the exit status.
    fork = subprocess.run([python, "-c", "import deepspeed, sys; sys.exit('+gafix' in deepspeed.__version__)"],
                          stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
    if fork.returncode:
        raise PristineNotFound(f"{venv} holds the fork, not upstream")
    return venv


def _build_pristine(venv, version, torch_version, python_version, base_python, like):
    python = venvs.python_of(venv)
    log = venv.with_name(venv.name + ".log")
    print(f"building {venv} (deepspeed {version}, torch {torch_version}, Python {python_version}); log: {log}",
          file=sys.stderr)
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)  # the log beside it (DS_GAFIX_VENV_DIR may be new)
    env = clean_environ()
    # The public version from the registry; its local label (+cpu, +cu130) must come out the same.
    public = torch_version.split("+")[0]
    if venvs.create(venv, base_python, log, env) or venvs.pip_install(venv, [f"torch=={public}"], log, env)[0]:
        raise PristineNotFound(f"building {venv} failed: see {log}")
    got = subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                         stdout=subprocess.PIPE,
                         text=True,
                         env=env).stdout.strip().splitlines()[-1:]
    got = got[0] if got else "nothing"
    if got != torch_version:
        shutil.rmtree(venv, ignore_errors=True)
        raise PristineNotFound(f"torch=={public} installed as {got}, not {torch_version} like {like}: make the "
                               "registry (or pip's find-links) serve that build")
    if (venvs.pip_install(venv, [f"deepspeed=={version}", "-r", REPO / "tests" / "requirements.txt"], log, env)[0]
            or venvs.install_layer(venv, log, env)[0]):
        shutil.rmtree(venv / "bin" / "pytest", ignore_errors=True)
        raise PristineNotFound(f"installing deepspeed=={version} and tools/ into {venv} failed: see {log}")


def pristine_python(given=None, fork_python=None):
    """The pristine interpreter: ``given``, else the python of ``pristine_venv`` on ``fork_python``'s torch and
    Python (default: this interpreter's)."""
    if given:
        return given
    return str(venvs.python_of(pristine_venv(like=fork_python)))


def clean_environ(**overrides):
    """This process's environment for a side's subprocess, without PYTHONPATH (each side's interpreter imports its
    own deepspeed, never one a path puts first) and without pytest's variables (a pytest run inside a test would
    take the outer run's PYTEST_ADDOPTS, CI's ``--junitxml`` among them), with ``overrides``."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH" and not key.startswith("PYTEST_")}
    env.update(overrides)
    return env
