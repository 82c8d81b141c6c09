# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Checkpoints saved by each earlier release of the fork load on this one: every file safely (weights_only and
DeepSpeed's allowlist), deep-equal to an unchecked load; without a checksum record (no release before wrote one),
so unverified, without an error; and load_checkpoint resumes each on the ranks that wrote it.

Slow: each release is built again from the repository's history (tests/data/releases.toml) into a directory of its
own, and 2 CPU ranks save the configurations with it (its modules first on PYTHONPATH).
"""

import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest
import torch

from toolkit.launch import launch_cases
from helpers.repo import REPO
from test_safe_checkpoints import CI_CONFIGS, WORKER, deep_equal, tag_files

RELEASES = tomllib.loads((Path(__file__).parent / "data" / "releases.toml").read_text())["releases"]
BUILD_TIMEOUT = 900  # seconds: fetching or reusing the upstream sdist, applying the release's patches


def built_release(commit, root):
    """The release's wheel contents, installed from its tree at ``commit`` into ``root / 'site'``."""
    source, site = root / "source", root / "site"
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", commit],
                             stdout=subprocess.PIPE,
                             check=True,
                             timeout=120)
    source.mkdir(parents=True)
    archive_path = root / "source.tar"
    archive_path.write_bytes(archive.stdout)
    with tarfile.open(archive_path) as tar:
        tar.extractall(source, filter="data")
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
         str(site), str(source)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=BUILD_TIMEOUT)
    assert install.returncode == 0, install.stdout[-3000:]
    shutil.rmtree(source)
    return site


@pytest.fixture(scope="module")
def saved_by_releases(tmp_path_factory, extensions_dir):
    """{release: checkpoint root}: CI's configurations saved on 2 ranks by each release."""
    saved = {}
    for release, commit in RELEASES.items():
        root = tmp_path_factory.mktemp(release.replace("+", "-"))
        site = built_release(commit, root)
        # Its own op cache: a release's ops are other sources under the same names.
        launched = launch_cases(WORKER,
                                2,
                                extensions_dir=str(root / "extensions"),
                                env={"PYTHONPATH": str(site)},
                                extra_args=["--save", str(root / "ckpt"), "--configs", ",".join(CI_CONFIGS)],
                                timeout=900)
        for config in CI_CONFIGS:
            outcome = launched.ranks[0][f"save/{config}"]
            assert outcome["ok"], f"{release} {config}: {outcome.get('error', '')[-2000:]}"
        saved[release] = root / "ckpt"
    return saved


@pytest.mark.slow
@pytest.mark.fork_only
@pytest.mark.parametrize("release", list(RELEASES))
def test_release_checkpoints_load_safely_and_resume(saved_by_releases, extensions_dir, release):
    from deepspeed.checkpoint import integrity
    from deepspeed.checkpoint.safe_load import load_file
    root = saved_by_releases[release]
    for config in CI_CONFIGS:
        files = tag_files(root / config)
        assert files, f"{release} {config}: no checkpoint files"
        for path in files:
            assert not os.path.exists(integrity.record_path(path)), f"{release} wrote a checksum record"
            safe = load_file(path, map_location="cpu")
            assert deep_equal(safe, torch.load(path, map_location="cpu", weights_only=False)), path
    launched = launch_cases(WORKER,
                            2,
                            extensions_dir=extensions_dir,
                            extra_args=["--resume", f"old={root}", "--configs", ",".join(CI_CONFIGS)],
                            timeout=600)
    for config in CI_CONFIGS:
        for rank, cases in enumerate(launched.ranks):
            outcome = cases[f"resume-old/{config}"]
            assert outcome["ok"], f"{release} {config}, rank {rank}: {outcome.get('error', '')[-2000:]}"
