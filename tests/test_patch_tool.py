# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""tools/patches.py: the series round-trips through a git work tree byte for byte, and rebases."""

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from helpers.repo import REPO, copy_repo

from gafix_build import assemble_tree, load_pin, obtain_sdist, read_series
from patch_facts import patch_name
from gafix_build.sdist import extract_sdist


def patches_tool(repo, *args, env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, str(Path(repo) / "tools" / "patches.py"), *args],
                          stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT,
                          text=True,
                          env=env)


def git(tree, *args):
    return subprocess.run(["git", *args], cwd=tree, check=True, stdout=subprocess.PIPE, text=True).stdout


def commit_all(tree, message):
    git(tree, "add", "-A")
    git(tree, "-c", "user.name=Test", "-c", "user.email=test@example.invalid", "commit", "-q", "-s", "-m", message)


@pytest.fixture
def repo_copy(tmp_path):
    return copy_repo(tmp_path / "repo")


def test_committed_series_is_up_to_date():
    proc = patches_tool(REPO, "check")
    assert proc.returncode == 0, proc.stdout


def test_materialise_is_pristine_base_plus_one_commit_per_patch(tmp_path):
    tree = tmp_path / "tree"
    proc = patches_tool(REPO, "materialise", "--dir", str(tree))
    assert proc.returncode == 0, proc.stdout
    subjects = git(tree, "log", "--reverse", "--format=%s", "gafix-base..gafix").splitlines()
    assert subjects == [p.subject for p in read_series(REPO)]
    pristine = extract_sdist(obtain_sdist(load_pin(REPO)), tmp_path / "pristine")
    base_files = git(tree, "ls-tree", "-r", "--name-only", "gafix-base").splitlines()
    assert len(base_files) == sum(1 for p in pristine.rglob("*") if p.is_file())
    # The base commit's content is the sdist's, file for file.
    subprocess.run(["git", f"--work-tree={pristine}", "diff", "--quiet", "gafix-base", "--"], cwd=tree, check=True)


def test_check_fails_on_a_hand_edited_patch(repo_copy):
    """A patch that still applies but is not what export writes (here: its diffstat removed)."""
    patch = read_series(repo_copy)[0].path
    text = patch.read_text()
    stat_start = text.index("\n---\n") + len("\n---\n")
    patch.write_text(text[:stat_start] + "\n" + text[text.index("diff --git", stat_start):])
    proc = patches_tool(repo_copy, "check")
    assert proc.returncode == 1, proc.stdout
    assert patch.name in proc.stdout


def test_check_fails_on_a_patch_without_signoff_test_or_changelog_entry(repo_copy):
    """Three patches, each missing one thing upstream needs: a Signed-off-by (one patch lacked one until
    gafix.2), a test that exists, a CHANGELOG entry. check names each and fails."""
    unsigned, untested, unlisted = [p.path for p in read_series(repo_copy)[1:4]]
    unsigned.write_text("".join(line for line in unsigned.read_text().splitlines(keepends=True)
                                if not line.startswith("Signed-off-by:")))
    text = untested.read_text()
    untested.write_text(
        text.replace(text[text.index("\nTest:"):text.index("\n---\n")],
                     "\nTest: tests/no_such_test.py covers it.\n\nSigned-off-by: A <a@b.c>"))
    name = patch_name(unlisted.name)
    changelog = repo_copy / "CHANGELOG.md"
    changelog.write_text(changelog.read_text().replace(name, "a patch"))
    proc = patches_tool(repo_copy, "check")
    assert proc.returncode == 1, proc.stdout
    assert f"{unsigned.name}: no Signed-off-by trailer" in proc.stdout
    assert f"{untested.name}: its message names no existing test file" in proc.stdout
    assert f"{unlisted.name}: CHANGELOG.md has no entry naming it ({name})" in proc.stdout


def test_check_fails_on_a_fix_patch_without_its_upstream_style_test(repo_copy):
    """A patch for upstream whose Test: paragraph names only the fork's suite, not a tests/unit file it
    adds, is not a PR upstream can merge: check names it (the fork's label, first in the series, is exempt)."""
    patch = read_series(repo_copy)[2].path
    text = patch.read_text()
    patch.write_text(
        text.replace(text[text.index("\nTest:"):text.index("\nSigned-off-by:")],
                     "\nTest: tests/test_engine_updates.py covers it.\n"))
    proc = patches_tool(repo_copy, "check")
    assert proc.returncode == 1, proc.stdout
    assert f"{patch.name}: it adds no upstream-style test of its own" in proc.stdout
    assert read_series(repo_copy)[0].path.name not in proc.stdout


def test_export_prs_apply_in_order_on_pristine_and_build_the_same_tree(tmp_path):
    """Each PR bundle applies with git am on pristine upstream after the ones before it; all applied,
    the tree is the one setup.py builds (less the fork's own files), each bundle keeps its sign-off,
    and the overlay files travel with the first patch that needs them."""
    out = tmp_path / "prs"
    proc = patches_tool(REPO, "export-prs", str(out))
    assert proc.returncode == 0, proc.stdout
    bundles = sorted(path for path in out.iterdir())
    assert [b.name for b in bundles] == [p.path.stem for p in read_series(REPO)]
    tree = tmp_path / "tree"
    assert patches_tool(REPO, "materialise", "--dir", str(tree)).returncode == 0
    git(tree, "checkout", "-q", "--detach", "gafix-base")
    for bundle in bundles:
        mbox = (bundle / "pr.mbox").read_text()
        assert "\nSigned-off-by: " in mbox, bundle.name
        assert (bundle / "description.md").read_text().startswith("# "), bundle.name
        git(tree, "-c", "user.name=T", "-c", "user.email=t@example.invalid", "am", "-q", str(bundle / "pr.mbox"))
    assert "op_builder/fused_norm.py" in (out / bundles[6].name / "description.md").read_text()
    built = assemble_tree(REPO, tmp_path / "built")
    ours = {p.relative_to(built).as_posix() for p in built.rglob("*") if p.is_file()}
    theirs = {p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_file() and ".git" not in p.parts}
    fork_only = {path for path in ours if path.startswith("deepspeed/gafix/")}
    assert theirs == ours - fork_only
    differing = [path for path in theirs if (tree / path).read_bytes() != (built / path).read_bytes()]
    assert differing == [], differing


def test_edit_export_build_mirrors_csrc(repo_copy, tmp_path):
    tree = tmp_path / "tree"
    assert patches_tool(repo_copy, "materialise", "--dir", str(tree)).returncode == 0
    marker = "// deepspeed-gafix test: this line reaches the sdist's deepspeed/ops/csrc copy too\n"
    with open(tree / "csrc" / "cpu" / "comm" / "shm.cpp", "a") as f:
        f.write(marker)
    # A patch for upstream carries its own upstream-style test.
    (tree / "tests" / "unit").mkdir(parents=True, exist_ok=True)
    (tree / "tests" / "unit" / "test_mark.py").write_text("def test_mark():\n    pass\n")
    commit_all(tree, "Mark shm.cpp\n\nA test edit.\n\nTest: tests/unit/test_mark.py")
    proc = patches_tool(repo_copy, "export", "--dir", str(tree))
    assert proc.returncode == 0, proc.stdout
    series = read_series(repo_copy)
    assert series[-1].subject == "Mark shm.cpp"
    changelog = repo_copy / "CHANGELOG.md"
    changelog.write_text(changelog.read_text() + "\n- Patch Mark-shm.cpp: a test edit.\n")
    # Until the new patch has its facts, check names it; with them it passes.
    proc = patches_tool(repo_copy, "check")
    assert proc.returncode == 1 and "patches/facts.toml: no entry for patch Mark-shm.cpp" in proc.stdout, proc.stdout
    facts = repo_copy / "patches" / "facts.toml"
    facts.write_text(facts.read_text() + '\n[patches."Mark-shm.cpp"]\nupstream = "none found"\n')
    proc = patches_tool(repo_copy, "check")
    assert proc.returncode == 0, proc.stdout
    built = assemble_tree(repo_copy)
    assert (built / "csrc/cpu/comm/shm.cpp").read_text().endswith(marker)
    assert (built / "deepspeed/ops/csrc/cpu/comm/shm.cpp").read_text().endswith(marker)


def fake_next_release(pristine_sdist, workdir, version, edit=None):
    """An sdist like the pinned one, as if upstream had released ``version`` with an unrelated change
    (and whatever ``edit(tree)`` changes besides)."""
    tree = extract_sdist(pristine_sdist, Path(workdir) / f"deepspeed-{version}")
    (tree / "version.txt").write_text(f"{version}\n")
    with open(tree / "deepspeed" / "constants.py", "a") as f:
        f.write("\n# an upstream change between releases\n")
    if edit:
        edit(tree)
    sdist = Path(workdir) / f"deepspeed-{version}.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(tree, arcname=tree.name)
    return sdist, hashlib.sha256(sdist.read_bytes()).hexdigest()


def test_rebase_onto_next_release(repo_copy, tmp_path):
    tree = tmp_path / "tree"
    assert patches_tool(repo_copy, "materialise", "--dir", str(tree)).returncode == 0
    sdist, sha = fake_next_release(obtain_sdist(load_pin(REPO)), tmp_path, "0.19.99")
    local = {"DS_GAFIX_UPSTREAM_SDIST": str(sdist)}
    proc = patches_tool(repo_copy,
                        "rebase",
                        "--dir",
                        str(tree),
                        "--version",
                        "0.19.99",
                        "--sha256",
                        sha,
                        env_extra=local)
    assert proc.returncode == 0, proc.stdout
    assert json.loads((repo_copy / "upstream.json").read_text())["version"] == "0.19.99"
    assert patches_tool(repo_copy, "export", "--dir", str(tree)).returncode == 0
    proc = patches_tool(repo_copy, "check", env_extra=local)
    assert proc.returncode == 0, proc.stdout
    built = assemble_tree(repo_copy, environ=dict(os.environ, **local))
    assert (built / "version.txt").read_text().strip() == "0.19.99"
    assert "an upstream change between releases" in (built / "deepspeed" / "constants.py").read_text()
    assert (built / "build.txt").read_text().strip().startswith("+gafix.")


def test_rebase_reports_each_patch_applied_already_upstream_or_conflicting(repo_copy, tmp_path):
    """A release that merged patch Count-every-pipeline-stage-in-clip_grad_norm_'s fix and rewrote the line the
    pipeline buffer patch (Reallocate-the-pipeline-s-gradient-buffer-when-the-d) changes: the report names the first
    already upstream, the second in conflict (in its file), every other patch applied."""
    series = read_series(repo_copy)
    merged = series[2]
    conflicting = next(patch for patch in series if "pipeline's gradient buffer" in patch.subject)

    def edit(tree):
        subprocess.run(["git", "apply", str(merged.path)], cwd=tree, check=True)
        engine = tree / "deepspeed" / "runtime" / "pipe" / "engine.py"
        old = "if len(self._grad_layer_buf) <= idx or self._grad_layer_buf[idx].numel() < numel:"
        assert old in engine.read_text()
        engine.write_text(engine.read_text().replace(old, old.replace("< numel", "< numel + 0")))

    tree = tmp_path / "tree"
    assert patches_tool(repo_copy, "materialise", "--dir", str(tree)).returncode == 0
    sdist, sha = fake_next_release(obtain_sdist(load_pin(REPO)), tmp_path, "0.19.99", edit)
    proc = patches_tool(repo_copy,
                        "rebase",
                        "--dir",
                        str(tree),
                        "--version",
                        "0.19.99",
                        "--sha256",
                        sha,
                        env_extra={"DS_GAFIX_UPSTREAM_SDIST": str(sdist)})
    assert proc.returncode == 1, proc.stdout  # the conflict stops the rebase for a person to resolve
    lines = {line.split(" ", 1)[0]: line for line in proc.stdout.splitlines() if line[:4].isdigit()}
    assert len(lines) == len(series), proc.stdout
    for index, patch in enumerate(series):
        line = lines[f"{index + 1:04d}"]
        assert line.startswith(f"{index + 1:04d} {patch.subject}: "), line
        if patch is merged:
            assert line.endswith(": already upstream"), line
        elif patch is conflicting:
            assert line.endswith(": conflicts in deepspeed/runtime/pipe/engine.py"), line
        else:
            assert line.endswith(": applied"), line


def test_a_patch_named_by_its_number_is_found():
    """A number changes when the series is reordered; check names every place that uses one for a patch, and leaves
    numbers that are not patches alone (a version, a port, a float). The samples are in tests/data, which the check
    itself leaves alone."""
    from patch_mentions import mentions
    # The numbers are spelt apart here so that this file names no patch by number itself.
    three, nine, twenty, twenty_three = ("00" + tail for tail in ("03", "09", "20", "23"))
    numbers = {three, nine, twenty, twenty_three}
    data = REPO / "tests" / "data" / "patch_mentions"
    found = mentions("prose.md", (data / "prose.md").read_text(), numbers)
    assert {words
            for line, words in found if line == 1} == {
                f"{three}/{nine}", f"{twenty}-{twenty_three}", f"patch {nine}", f"patches {twenty} and {twenty_three}",
                three, nine, twenty, twenty_three
            }
    # In a code span and in a fenced block too, by the word; a bare number only in prose; never 0042 or 10009.
    assert [(line, words) for line, words in found if line > 1] == [(2, f"patch {three}"), (4, f"patch {three}")]
    assert mentions("tools/x.py", (data / "code.txt").read_text(), numbers) == [(1, f"patch {three}")]
    # A patch's message is read, not its diff.
    assert mentions("patches/0004-x.patch", (data / "message.patch").read_text(), numbers) == [(3, f"patch {three}")]
