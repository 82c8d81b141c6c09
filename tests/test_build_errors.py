# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""A wrong build input stops `pip` with one line naming it, and nothing gets installed.

Each case breaks one input in a scratch copy of the repository and runs a real pip build there.
"""

import json
import os
import subprocess
import sys

import pytest

from helpers.repo import copy_repo

ERROR_PREFIX = "error: deepspeed-gafix: "


@pytest.fixture
def repo_copy(tmp_path):
    return copy_repo(tmp_path / "repo")


def pip_install_to_target(source, target, env_extra=None):
    """pip install into a --target folder: even a wrongly successful build cannot touch the test venv."""
    env = dict(os.environ, **(env_extra or {}))
    cmd = [
        sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--disable-pip-version-check",
        "--target",
        str(target),
        str(source)
    ]
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def error_lines(output):
    return [line.strip() for line in output.splitlines() if ERROR_PREFIX in line]


def assert_refused(proc, target, expected):
    assert proc.returncode != 0, proc.stdout[-3000:]
    lines = error_lines(proc.stdout)
    assert len(lines) == 1, proc.stdout[-3000:]
    assert expected in lines[0], lines[0]
    assert not list(target.glob("deepspeed*")), "a failed build left a package behind"


def test_wrong_sha256(repo_copy, tmp_path):
    pin_file = repo_copy / "upstream.json"
    pin = json.loads(pin_file.read_text())
    pin["sha256"] = "0" * 64
    pin_file.write_text(json.dumps(pin))
    proc = pip_install_to_target(repo_copy, tmp_path / "target")
    assert_refused(proc, tmp_path / "target", "sha256 mismatch")


def test_missing_local_sdist(repo_copy, tmp_path):
    missing = tmp_path / "nowhere" / "deepspeed-0.19.8.tar.gz"
    proc = pip_install_to_target(repo_copy, tmp_path / "target", {"DS_GAFIX_UPSTREAM_SDIST": str(missing)})
    assert_refused(proc, tmp_path / "target", f"DS_GAFIX_UPSTREAM_SDIST={missing}: no such file")


def test_patch_that_does_not_apply(repo_copy, tmp_path):
    broken = "9999-broken.patch"
    (repo_copy / "patches" / broken).write_text(
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        "From: Nobody <nobody@example.invalid>\n"
        "Subject: [PATCH] Edit a line that is not there\n\n---\n"
        "diff --git a/version.txt b/version.txt\n"
        "--- a/version.txt\n+++ b/version.txt\n"
        "@@ -1 +1 @@\n-9.9.9\n+9.9.10\n")
    with open(repo_copy / "patches" / "series", "a") as series:
        series.write(broken + "\n")
    proc = pip_install_to_target(repo_copy, tmp_path / "target")
    assert_refused(proc, tmp_path / "target", f"patches/{broken} does not apply")


def test_unlisted_patch(repo_copy, tmp_path):
    (repo_copy / "patches" / "9998-forgotten.patch").write_text("Subject: [PATCH] x\n")
    proc = pip_install_to_target(repo_copy, tmp_path / "target")
    assert_refused(proc, tmp_path / "target", "patches/9998-forgotten.patch is not listed")


def test_overlay_may_not_overwrite_upstream(repo_copy, tmp_path):
    (repo_copy / "deepspeed" / "env_report.py").write_text("# a copy of an upstream file\n")
    proc = pip_install_to_target(repo_copy, tmp_path / "target")
    assert_refused(proc, tmp_path / "target", "deepspeed/env_report.py would overwrite upstream's")


def test_ds_build_string_refused(repo_copy, tmp_path):
    proc = pip_install_to_target(repo_copy, tmp_path / "target", {"DS_BUILD_STRING": ".dev1"})
    assert_refused(proc, tmp_path / "target", "DS_BUILD_STRING is not supported")
