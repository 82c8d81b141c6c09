# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The patch series as a git work tree: pristine upstream's sdist as the base commit (tag ``BASE_TAG``), one commit
per patch of patches/series (branch ``BRANCH``), made the same way whoever makes it. tools/patches.py edits and
exports it; tools/pr_bundles.py and the upstream suite's prefixes tier build on it."""

import os
import subprocess
from pathlib import Path

from toolkit import REPO
from gafix_build import BuildError, load_pin, obtain_sdist, read_series
from gafix_build.sdist import extract_sdist

BASE_TAG = "gafix-base"
BRANCH = "gafix"
# Fixed so that the same series always materialises to the same commits, whoever runs it.
_UPSTREAM_IDENTITY = {
    "GIT_AUTHOR_NAME": "DeepSpeed upstream",
    "GIT_AUTHOR_EMAIL": "upstream@deepspeed.invalid",
    "GIT_COMMITTER_NAME": "deepspeed-gafix patches tool",
    "GIT_COMMITTER_EMAIL": "patches@deepspeed-gafix.invalid",
    "GIT_AUTHOR_DATE": "1970-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "1970-01-01T00:00:00+0000",
}
# Settings that change format-patch output; pinned so that export does not depend on ~/.gitconfig.
FORMAT_CONFIG = [
    "-c", "diff.noprefix=false", "-c", "diff.mnemonicPrefix=false", "-c", "diff.renames=false", "-c",
    "format.numbered=false", "-c", "format.signature=", "-c", "core.quotePath=true", "-c", "format.coverLetter=false"
]


def git(tree, *args, env=None, check=True):
    full_env = dict(os.environ)
    full_env["GIT_CEILING_DIRECTORIES"] = str(Path(tree).resolve().parent)
    full_env.update(env or {})
    proc = subprocess.run(["git", *args],
                          cwd=tree,
                          env=full_env,
                          stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE,
                          text=True)
    if check and proc.returncode != 0:
        raise BuildError(f"git {' '.join(args[:2])} in {tree} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def commit_upstream(tree, pin, message_extra=""):
    """Commit the whole tree as the pristine upstream release."""
    git(tree, "add", "-A", "-f")
    message = f"deepspeed {pin.version} (upstream sdist, sha256 {pin.sha256}){message_extra}"
    git(tree, "commit", "-q", "--allow-empty", "--no-verify", "-m", message, env=_UPSTREAM_IDENTITY)


def apply_mbox(tree, patch_path):
    """``git am`` one format-patch or PR bundle mbox on ``tree``, as the series is applied; the process result."""
    return git(tree, "am", "-q", "--keep-cr", "--whitespace=nowarn", str(patch_path), env=committer(), check=False)


def materialise(tree, repo=REPO, environ=os.environ):
    tree = Path(tree).resolve()
    if tree.exists():
        raise BuildError(f"{tree} exists: remove it or pass another --dir")
    pin = load_pin(repo)
    patches = read_series(repo)
    sdist = obtain_sdist(pin, environ)
    tree.parent.mkdir(parents=True, exist_ok=True)
    extract_sdist(sdist, tree)
    git(tree, "init", "-q", "-b", BRANCH)
    commit_upstream(tree, pin)
    git(tree, "tag", BASE_TAG)
    for patch in patches:
        proc = apply_mbox(tree, patch.path)
        if proc.returncode != 0:
            git(tree, "am", "--abort", check=False)
            raise BuildError(f"patches/{patch.name} does not apply with git am: {proc.stderr.strip().splitlines()[0]}")
    return tree


def committer():
    return {k: v for k, v in _UPSTREAM_IDENTITY.items() if k.startswith("GIT_COMMITTER")}
