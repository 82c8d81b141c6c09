# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""PR bundles (``tools/patches.py export-prs DIR``): per patch, what a pull request to upstream needs.

``DIR/<patch>/pr.mbox`` applies with ``git am`` on a git tree of pristine upstream once the bundles
before it are applied, and carries every file the change needs: the patch itself plus the files of
our overlay it is the first to use (the fused_norm op's sources and builders go with the patch that
lets the accelerator build it, its Python wrapper with the norm patch). ``DIR/<patch>/description.md``
is the PR text: the subject as title, the message's bug / cause / fix / test, the files.

Every overlay file is either assigned to a patch below or listed as the fork's own (never proposed
upstream); a new overlay file in neither is an error, so none is forgotten.
"""

import shutil
import tempfile
from pathlib import Path

from toolkit import REPO
from gafix_build import BuildError, load_pin, read_series
from gafix_build.assemble import _mirror_of, overlay_files
from patch_facts import FACTS_FILE, load as load_facts
from patch_tree import BASE_TAG, BRANCH, FORMAT_CONFIG, committer, git, materialise

# The fork's own files: ds_gas_check and the build report stay out of every PR.
FORK_ONLY = ("deepspeed/gafix/", )


def _matches(path, prefixes):
    return any(path == prefix or (prefix.endswith("/") and path.startswith(prefix)) for prefix in prefixes)


def assign_overlay(files, repo=REPO):
    """``{patch number: [overlay files]}`` (patches/facts.toml's overlay); BuildError naming any file that belongs
    nowhere."""
    overlay_with = load_facts(repo).overlay()
    assigned, unplaced = {}, []
    for path in files:
        owner = next((number for number, prefixes in overlay_with.items() if _matches(path, prefixes)), None)
        if owner is not None:
            assigned.setdefault(owner, []).append(path)
        elif not _matches(path, FORK_ONLY):
            unplaced.append(path)
    if unplaced:
        raise BuildError(f"overlay files in no PR bundle: {', '.join(unplaced)}; give each to a patch (its overlay in "
                         f"{FACTS_FILE}), or list it in tools/pr_bundles.py FORK_ONLY")
    return assigned


def description(patch_text, subject, files, added, version):
    """The PR text from a format-patch file's message."""
    message = patch_text.split("\n---\n", 1)[0]
    body = message.split("\n\n", 1)[1] if "\n\n" in message else ""
    body = "\n".join(line for line in body.splitlines() if not line.startswith("Signed-off-by:")).strip()
    lines = [
        f"# {subject}", "", body, "", f"Applies on deepspeed {version} after the bundles before it.", "",
        "Files changed or added:", ""
    ]
    new = set(added) | {copy for copy in map(_mirror_of, added) if copy}
    lines += [f"- `{path}`" + (" (new: from deepspeed-gafix's overlay)" if path in new else "") for path in files]
    if any(_mirror_of(path) for path in files):
        lines += [
            "", "The sdist keeps copies of `csrc/`, `op_builder/` and `accelerator/` under `deepspeed/`; in "
            "upstream's git repository those are symlinks, so the copies are left out there."
        ]
    return "\n".join(lines) + "\n"


def _copy(source, target):
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, target)


def export_prs(out_dir, repo=REPO):
    """Write one bundle per patch of the series into ``out_dir``; return the bundle directories."""
    out_dir = Path(out_dir)
    patches = read_series(repo)
    assigned = assign_overlay(overlay_files(repo), repo)
    not_for_upstream = load_facts(repo).not_for_upstream()
    version = load_pin(repo).version
    bundles = []
    with tempfile.TemporaryDirectory() as tmp:
        tree = materialise(Path(tmp) / "tree", repo)
        commits = git(tree, "rev-list", "--reverse", f"{BASE_TAG}..{BRANCH}").stdout.split()
        git(tree, "checkout", "-q", "-b", "prs", BASE_TAG)
        for patch, commit in zip(patches, commits):
            git(tree, "cherry-pick", "--allow-empty", commit, env=committer())
            added = assigned.get(patch.name[:4], [])
            for rel in added:
                _copy(Path(repo) / rel, tree / rel)
            # The sdist's copies of csrc/, op_builder/ and accelerator/ follow their originals, as the
            # build makes them (in upstream's git repository they are symlinks).
            for rel in git(tree, "show", "--name-only", "--format=", "HEAD").stdout.split() + added:
                if _mirror_of(rel) and (tree / rel).is_file():
                    _copy(tree / rel, tree / _mirror_of(rel))
            git(tree, "add", "-A", "-f")
            if git(tree, "diff", "--cached", "--quiet", check=False).returncode != 0:
                git(tree, "commit", "-q", "--amend", "--no-edit", "--no-verify", env=committer())
            bundle = out_dir / patch.path.stem
            if bundle.exists():
                shutil.rmtree(bundle)
            bundle.mkdir(parents=True)
            mbox = git(tree, *FORMAT_CONFIG, "format-patch", "-1", "--stdout", "--zero-commit", "--no-signature",
                       "--full-index", "--no-numbered", "--no-renames", "HEAD").stdout
            (bundle / "pr.mbox").write_text(mbox)
            files = git(tree, "show", "--name-only", "--format=", "HEAD").stdout.split()
            text = description(mbox, patch.subject, files, added, version)
            if patch.name[:4] in not_for_upstream:
                text = text.replace(
                    "\n", "\n\n**Not for upstream**: the fork's own label; later bundles apply "
                    "without it only where they touch none of its lines.\n", 1)
            (bundle / "description.md").write_text(text)
            bundles.append(bundle)
    return bundles
