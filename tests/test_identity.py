# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The installed wheel says it is the fork, and lists exactly the patches of patches/series."""

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.repo import REPO

pytestmark = pytest.mark.fork_only

from gafix_build import load_pin, read_series


def test_version_has_the_fork_label():
    import deepspeed
    upstream = load_pin(REPO).version
    assert re.fullmatch(re.escape(upstream) + r"\+gafix\.[1-9][0-9]*", deepspeed.__version__)
    # The distribution keeps upstream's name, so whatever requires "deepspeed" stays satisfied.
    assert importlib.metadata.version("deepspeed") == deepspeed.__version__


def test_wheel_lists_the_committed_series():
    import deepspeed.gafix
    committed = [(p.name, p.subject) for p in read_series(REPO)]
    assert list(deepspeed.gafix.PATCHES) == committed
    pin = load_pin(REPO)
    assert (deepspeed.gafix.UPSTREAM_VERSION, deepspeed.gafix.UPSTREAM_SHA256) == (pin.version, pin.sha256)


def test_ds_report_lists_the_patches():
    ds_report = Path(sys.executable).with_name("ds_report")
    out = subprocess.run([str(ds_report), "--hide_operator_status"],
                         stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT,
                         text=True,
                         check=True).stdout
    assert "deepspeed-gafix" in out
    for patch in read_series(REPO):
        assert f"  {patch.name}: {patch.subject}" in out
