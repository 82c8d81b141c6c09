# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Tests run against the INSTALLED deepspeed: this fork's wheel, or pristine upstream for comparison.

Markers: ``fork_only`` (checks what only the fork has: skipped against upstream), ``slow`` (left out
unless ``--run-slow``).
"""

import importlib.metadata
import os
from pathlib import Path

import pytest

# The tests import the maintainers' layer (toolkit, the tiers, the tools' modules: gpu_check, patches, upstream_suite)
# from its editable install, tools/pyproject.toml, which README's test command makes.
try:
    import toolkit  # noqa: F401
except ImportError as err:
    raise ImportError("the maintainers' layer is not installed in this environment: pip install -e tools "
                      "(README's test command does)") from err

# Run first, costliest first (CI's times by module: tools/ci-time); the other modules follow in their own order. With
# README's two pytest-xdist workers (-n 2 --dist loadfile: a module's tests, and the launch they share, stay on one
# worker) the long ones then start early and the workers finish together; a worker that took one last would run
# alone for its minutes.
COSTLIEST_FIRST = ("test_gas_check.py", "test_client_tier.py", "test_checkpoint_swap.py", "test_upstream_suite.py",
                   "test_patch_tool.py", "test_gas_check_models.py", "test_hf_trainer.py", "test_gas_check_restart.py")


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", help="also run tests marked slow")


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):
        # pytest-xdist orders modules by their number of tests unless told not to: take them in collection order.
        config.option.loadscopereorder = False
    config.addinivalue_line("markers", "fork_only: needs deepspeed-gafix (skipped against pristine upstream)")
    config.addinivalue_line("markers", "slow: takes minutes; run with --run-slow")


def installed_deepspeed():
    try:
        import deepspeed
    except ImportError as err:
        pytest.exit(f"deepspeed is not installed ({err}): run README's install command first", returncode=4)
    location = Path(deepspeed.__file__).resolve()
    try:
        installed = Path(importlib.metadata.distribution("deepspeed").locate_file("deepspeed/__init__.py")).resolve()
    except importlib.metadata.PackageNotFoundError:
        installed = None
    if location != installed:
        pytest.exit(f"deepspeed imported from {location}, not from the installed distribution ({installed})",
                    returncode=4)
    return deepspeed


def is_fork():
    return "+gafix." in installed_deepspeed().__version__


def pytest_report_header(config):
    deepspeed = installed_deepspeed()
    kind = "deepspeed-gafix" if is_fork() else "pristine upstream: fork_only tests skipped"
    return f"deepspeed {deepspeed.__version__} ({kind}) from {Path(deepspeed.__file__).parent}"


def pytest_collection_modifyitems(config, items):
    rank = {name: position for position, name in enumerate(COSTLIEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
    fork = is_fork()
    run_slow = config.getoption("--run-slow")
    for item in items:
        if "fork_only" in item.keywords and not fork:
            item.add_marker(pytest.mark.skip(reason="fork_only: the installed deepspeed is not deepspeed-gafix"))
        if "slow" in item.keywords and not run_slow:
            item.add_marker(pytest.mark.skip(reason="slow: run with --run-slow"))


@pytest.fixture(scope="session")
def extensions_dir(tmp_path_factory):
    """A TORCH_EXTENSIONS_DIR private to this run (JIT ops build once, then every launch reuses them).

    Set DS_GAFIX_TEST_EXTENSIONS_DIR to keep the builds across runs.
    """
    kept = os.environ.get("DS_GAFIX_TEST_EXTENSIONS_DIR")
    if kept:
        return Path(kept)
    # pytest-xdist's workers each have a base temp of their own under the run's: the run's is shared, so each op
    # builds once for all workers (torch's JIT build lock makes a second builder wait, then load).
    run_root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        run_root = run_root.parent
    extensions = run_root / "torch_extensions"
    extensions.mkdir(exist_ok=True)
    return extensions
