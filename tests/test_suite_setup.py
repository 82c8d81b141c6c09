# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""How the suite itself runs: README's two commands as CI reads them, the test command's two pytest-xdist workers,
and the venvs that workers share."""

import subprocess
import sys
import textwrap

import pytest

from conftest import COSTLIEST_FIRST
from helpers.repo import REPO

pytestmark = pytest.mark.fork_only


def test_readme_commands_are_read_as_ci_reads_them():
    from toolkit import readme
    assert readme.command("install-and-demo").startswith("pip install ")
    assert " python -m pytest tests" in readme.command("test")
    # CI reads them before it makes its venv: -S, no site-packages (no layer, no deepspeed) and no PYTHONPATH.
    ci = subprocess.run([sys.executable, "-S", str(REPO / "tools" / "readme-command"), "test"],
                        cwd=REPO,
                        env={},
                        stdout=subprocess.PIPE,
                        text=True,
                        check=True)
    assert ci.stdout.strip() == readme.command("test")
    missing = subprocess.run(
        [sys.executable, "-S", str(REPO / "tools" / "readme-command"), "no-such-command"],
        env={},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True)
    assert missing.returncode == 1 and "<!-- command: no-such-command -->" in missing.stderr


def test_a_missing_command_is_an_error_naming_its_marker(tmp_path):
    from toolkit import readme
    page = tmp_path / "README.md"
    page.write_text("<!-- command: test -->\n```bash\npip install x && python -m pytest\n```\n")
    with pytest.raises(readme.NoCommand, match="<!-- command: install-and-demo -->"):
        readme.command("install-and-demo", page)
    assert readme.pytest_args(page) == []
    page.write_text("<!-- command: test -->\n```bash\n```\n")
    with pytest.raises(readme.NoCommand, match="no command in the code block"):
        readme.command("test", page)


def test_a_module_and_its_shared_launch_stay_on_one_worker():
    """A module's tests share one launch (a module-scoped fixture): spread over two workers, each would launch every
    case. ``--dist loadfile`` keeps a module on one worker."""
    from toolkit import readme
    args = readme.pytest_args()
    if "-n" not in args:
        pytest.skip("README's test command runs one process")
    assert args[args.index("--dist") + 1] == "loadfile", args


def test_the_modules_started_first_exist():
    missing = [name for name in COSTLIEST_FIRST if not (REPO / "tests" / name).is_file()]
    assert not missing, f"tests/conftest.py's COSTLIEST_FIRST names modules that are gone: {missing}"


def test_a_second_builder_of_a_venv_waits_for_the_first(tmp_path):
    """Two workers wanting pristine's venv at once: the first builds it, the second waits, then finds it built
    (without the lock both built it, each deleting what the other installed)."""
    venv = tmp_path / "venv"
    builder = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from toolkit import venvs
        venv = Path({str(venv)!r})
        with venvs.building(venv):
            print("entered", time.time(), flush=True)
            if not venv.exists():
                time.sleep(3)
                venv.mkdir()
                print("built", flush=True)
            print("left", time.time(), flush=True)
    """)
    first = subprocess.Popen([sys.executable, "-c", builder], stdout=subprocess.PIPE, text=True)
    assert first.stdout.readline().startswith("entered")
    second = subprocess.Popen([sys.executable, "-c", builder], stdout=subprocess.PIPE, text=True)
    first_out, second_out = first.communicate(timeout=60)[0], second.communicate(timeout=60)[0]
    assert "built" in first_out and "built" not in second_out, (first_out, second_out)
    left = float(first_out.split("left")[1].split()[0])
    entered = float(second_out.split()[1])
    assert entered >= left, "the second builder entered while the first held the venv"


def test_the_layer_installs_every_module_under_tools():
    """tools/pyproject.toml names what the editable install maps: a module or package it leaves out imports nowhere
    (the repository's folders are not on sys.path)."""
    import tomllib
    from toolkit import readme
    declared = tomllib.loads((REPO / "tools" / "pyproject.toml").read_text())["tool"]["setuptools"]
    modules = {path.stem for path in (REPO / "tools").glob("*.py")}
    packages = {path.parent.name for path in (REPO / "tools").glob("*/__init__.py")} | {"gafix_build"}
    assert set(declared["py-modules"]) == modules
    assert set(declared["packages"]) == packages
    # README's test command installs it, so CI's and every user's run of the tests has it.
    assert "-e tools" in readme.command("test")
