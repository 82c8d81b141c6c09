#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Edit the patch series as git commits, and export it back.

  materialise  git work tree: pristine upstream sdist as the base commit (tag gafix-base),
               one commit per patch of patches/series (branch gafix)
  export       write the commits gafix-base..HEAD back to patches/ and patches/series
  check        fail when exporting a fresh work tree would change patches/ (byte for byte), or when
               a patch lacks a Signed-off-by, a test or a CHANGELOG entry (tools/patch_rules.py)
  rebase       move the work tree's commits onto a new upstream release and update upstream.json
  export-prs   per patch, a PR bundle (mbox for git am on pristine upstream, with the overlay files it
               needs, and a description): tools/pr_bundles.py

See docs/develop/patches.md for the workflow.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from toolkit import REPO
from gafix_build import BuildError, Pin, load_pin, obtain_sdist, read_series
from gafix_build.pin import PIN_FILE
from gafix_build.sdist import extract_sdist
from gafix_build.series import SERIES_FILE
from patch_facts import load as load_facts
from patch_rules import problems as patch_problems
from patch_tree import BASE_TAG, BRANCH, FORMAT_CONFIG, commit_upstream, committer, git, materialise

DEFAULT_TREE = REPO / "build" / "patch-tree"
SERIES_HEADER = "# Applied in this order by setup.py; edit with tools/patches.py (docs/develop/patches.md).\n"


def export(tree, patches_dir):
    """Write gafix-base..HEAD of ``tree`` as format-patch files plus a series file into ``patches_dir``."""
    tree = Path(tree).resolve()
    patches_dir = Path(patches_dir)
    with tempfile.TemporaryDirectory() as tmp:
        git(tree, *FORMAT_CONFIG, "format-patch", "-q", "--zero-commit", "--no-signature", "--full-index",
            "--no-numbered", "--no-renames", "-o", tmp, f"{BASE_TAG}..HEAD")
        names = sorted(os.listdir(tmp))
        patches_dir.mkdir(parents=True, exist_ok=True)
        for old in patches_dir.glob("*.patch"):
            old.unlink()
        for name in names:
            shutil.copyfile(os.path.join(tmp, name), patches_dir / name)
    (patches_dir / "series").write_text(SERIES_HEADER + "".join(f"{name}\n" for name in names))
    return names


def _exported_names(folder):
    """What export writes: the patches and the series (patches/facts.toml is written by hand)."""
    return {path.name for path in Path(folder).iterdir() if path.suffix == ".patch" or path.name == "series"}


def check(repo=REPO):
    """Materialise and export into scratch space; return the differences from the committed patches/."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = materialise(Path(tmp) / "tree", repo)
        exported = Path(tmp) / "patches"
        export(tree, exported)
        committed = Path(repo) / "patches"
        names = sorted(_exported_names(exported) | _exported_names(committed))
        return [
            name for name in names if not (exported / name).is_file() or not (committed / name).is_file() or (
                exported / name).read_bytes() != (committed / name).read_bytes()
        ]


def rule_problems(repo=REPO):
    """What each patch of the series lacks to go upstream (tools/patch_rules.py), in series order, after what is
    wrong in patches/facts.toml against the series (tools/patch_facts.py)."""
    try:
        not_for_upstream = load_facts(repo).not_for_upstream()
    except ValueError as err:
        return str(err).splitlines()
    changelog = (Path(repo) / "CHANGELOG.md").read_text()
    return [
        problem for patch in read_series(repo)
        for problem in patch_problems(patch.path, repo, changelog, not_for_upstream)
    ]


def replay_report(tree, new_base, commits, names):
    """``[(patch name, outcome, conflicting files)]``: each patch cherry-picked in order onto
    ``new_base`` in a scratch worktree; outcome "applied", "already upstream" (nothing left to change)
    or "conflicts" (that patch is skipped, so later ones are tried on without it)."""
    report = []
    with tempfile.TemporaryDirectory(dir=Path(tree).parent) as tmp:
        scratch = Path(tmp) / "replay"
        git(tree, "worktree", "add", "-q", "--detach", str(scratch), new_base)
        try:
            for name, commit in zip(names, commits):
                proc = git(scratch, "cherry-pick", "--no-commit", commit, env=committer(), check=False)
                if proc.returncode != 0:
                    files = git(scratch, "diff", "--name-only", "--diff-filter=U").stdout.split()
                    git(scratch, "reset", "-q", "--hard", "HEAD")
                    report.append((name, "conflicts", files))
                elif git(scratch, "diff", "--cached", "--quiet", check=False).returncode == 0:
                    report.append((name, "already upstream", []))
                else:
                    git(scratch, "commit", "-q", "--no-verify", "-C", commit, env=committer())
                    report.append((name, "applied", []))
        finally:
            git(tree, "worktree", "remove", "--force", str(scratch), check=False)
    return report


def rebase(tree, version, sha256, repo=REPO):
    """Rebase the work tree's commits onto a new upstream release; update upstream.json when it lands."""
    tree = Path(tree).resolve()
    old_pin = load_pin(repo)
    new_pin = Pin(package=old_pin.package, version=version, sha256=sha256)
    sdist = obtain_sdist(new_pin)
    git(tree, "checkout", "-q", "--detach", BASE_TAG)
    with tempfile.TemporaryDirectory(dir=tree.parent) as tmp:
        unpacked = extract_sdist(sdist, Path(tmp) / "new")
        for entry in os.listdir(tree):
            if entry != ".git":
                path = tree / entry
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        for entry in os.listdir(unpacked):
            os.replace(unpacked / entry, tree / entry)
    commit_upstream(tree, new_pin, message_extra=f", after {old_pin.version}")
    new_base = git(tree, "rev-parse", "HEAD").stdout.strip()
    old_base = git(tree, "rev-parse", BASE_TAG).stdout.strip()
    git(tree, "tag", "-f", f"upstream-{old_pin.version}", old_base)
    git(tree, "tag", "-f", BASE_TAG, new_base)
    commits = git(tree, "rev-list", "--reverse", f"{old_base}..{BRANCH}").stdout.split()
    names = git(tree, "log", "--reverse", "--format=%s", f"{old_base}..{BRANCH}").stdout.splitlines()
    report = replay_report(tree, new_base, commits, names)
    proc = git(tree, "rebase", "-q", "--onto", new_base, old_base, BRANCH, env=committer(), check=False)
    (Path(repo) / PIN_FILE).write_text(
        json.dumps({
            "package": new_pin.package,
            "version": new_pin.version,
            "sha256": new_pin.sha256
        }, indent=2) + "\n")
    return proc.returncode == 0, report


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("materialise", "export", "rebase"):
        cmd = sub.add_parser(name)
        cmd.add_argument("--dir", default=str(DEFAULT_TREE), help=f"work tree (default: {DEFAULT_TREE})")
        if name == "rebase":
            cmd.add_argument("--version", required=True, help="the new upstream release, e.g. 0.19.9")
            cmd.add_argument("--sha256", required=True, help="sha256 of its sdist (from the registry's file list)")
    sub.add_parser("check")
    prs = sub.add_parser("export-prs")
    prs.add_argument("out_dir", metavar="DIR", help="where the bundles go (one directory per patch)")
    args = parser.parse_args(argv)
    try:
        if args.command == "materialise":
            tree = materialise(args.dir)
            print(f"work tree at {tree}: base tag {BASE_TAG}, branch {BRANCH}. Commit there, then export.")
        elif args.command == "export":
            names = export(args.dir, REPO / "patches")
            print(f"exported {len(names)} patch(es) to patches/ and {SERIES_FILE}")
        elif args.command == "check":
            from patch_mentions import numbered_mentions
            differing, lacking = check(), rule_problems() + numbered_mentions()
            if differing:
                print("patches/ differs from a fresh materialise+export in: " + ", ".join(differing))
                print("run: tools/patches.py materialise && tools/patches.py export")
            for problem in lacking:
                print(problem)
            if differing or lacking:
                return 1
            print(
                f"{SERIES_FILE} is up to date: materialise+export reproduces patches/ byte for byte; every "
                "patch is signed off, names its test and has a CHANGELOG entry, and each for upstream adds its own "
                "test under tests/unit; patches/facts.toml holds every patch's facts; no file names a patch by number")
        elif args.command == "export-prs":
            from pr_bundles import export_prs
            bundles = export_prs(args.out_dir)
            print(f"{len(bundles)} PR bundle(s) in {args.out_dir}: apply their pr.mbox in order with git am")
        elif args.command == "rebase":
            landed, report = rebase(args.dir, args.version, args.sha256)
            for number, (subject, outcome, files) in enumerate(report, 1):
                print(f"{number:04d} {subject}: {outcome}" + (f" in {', '.join(files)}" if files else ""))
            if landed:
                print(f"rebased onto {args.version}; upstream.json updated. Now: tools/patches.py export")
            else:
                print(f"conflicts: resolve in {args.dir}, `git rebase --continue` there, then tools/patches.py export "
                      f"(upstream.json already pins {args.version})")
                return 1
    except BuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
