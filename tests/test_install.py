# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The fork's wheel is a drop-in `deepspeed`: built with pip, it replaces an installed upstream release."""

import subprocess
import sys
import venv
import zipfile

import pytest

from helpers.repo import REPO

from gafix_build import load_pin, obtain_sdist


def pip(python, *args):
    return subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", *args],
                          stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT,
                          text=True)


@pytest.fixture(scope="module")
def fork_wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    proc = pip(sys.executable, "wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(REPO))
    assert proc.returncode == 0, proc.stdout[-3000:]
    wheels = list(out.glob("deepspeed-*.whl"))
    assert len(wheels) == 1, proc.stdout[-3000:]
    return wheels[0]


def test_wheel_is_named_deepspeed_with_the_fork_label(fork_wheel):
    version = load_pin(REPO).version
    assert fork_wheel.name.startswith(f"deepspeed-{version}+gafix.")
    with zipfile.ZipFile(fork_wheel) as wheel:
        names = set(wheel.namelist())
        report = wheel.read("deepspeed/env_report.py").decode()
    assert "deepspeed/gafix/_build_info.py" in names
    assert "deepspeed/ops/op_builder/builder.py" in names  # upstream's packaging is intact
    assert "print_fork_report(" in report  # patch Report-the-build-as-deepspeed-gafix is in


def test_wheel_replaces_installed_upstream(fork_wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    upstream = obtain_sdist(load_pin(REPO))
    # --no-deps: the point is pip's view of the one `deepspeed` distribution, not torch.
    proc = pip(python, "install", "--no-deps", str(upstream))
    assert proc.returncode == 0, proc.stdout[-3000:]
    proc = pip(python, "install", "--no-deps", str(fork_wheel))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "Successfully uninstalled deepspeed-" in proc.stdout
    listed = [line.split() for line in pip(python, "list").stdout.splitlines() if line.lower().startswith("deepspeed")]
    assert listed == [["deepspeed", fork_wheel.name.split("-")[1]]]
