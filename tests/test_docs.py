# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The documentation a user reads: README.md, CONTRIBUTING.md, CHANGELOG.md and docs/.

Every relative link points at a file of the repository (and an anchor at one of its headings), and no line
runs past 300 characters but those of the reports the tools generate (docs/evidence/)."""

import functools
import re
import subprocess
import sys

import pytest

import patch_facts
from helpers.patch_tables import patch_rows
from helpers.repo import REPO, repo_files

DOCS = sorted(
    name for name in repo_files()
    if name.endswith(".md") and (name.startswith("docs/") or name in ("README.md", "CONTRIBUTING.md", "CHANGELOG.md")))
# [text](target) outside code spans; images too.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`[^`]*`")
LONGEST_LINE = 300


def prose_lines(text):
    """(line number, line) of ``text`` outside fenced code blocks, code spans blanked."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield number, CODE_SPAN.sub("``", line)


def slug(heading):
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lstrip("#").strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@functools.lru_cache(maxsize=None)
def anchors(path):
    """The anchors of the page at ``path``: read once however many links point into it."""
    return {slug(line) for _, line in prose_lines(path.read_text()) if re.match(r"#{1,6} ", line)}


def broken_links(name):
    path = REPO / name
    broken = []
    for number, line in prose_lines(path.read_text()):
        for target in LINK.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if not dest.exists():
                broken.append(f"{name}:{number}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{name}:{number}: {target}: no heading '#{anchor}' in {dest.relative_to(REPO)}")
    return broken


def test_there_are_docs_to_check():
    assert "README.md" in DOCS and any(name.startswith("docs/guides/") for name in DOCS)


@pytest.mark.parametrize("name", DOCS)
def test_relative_links_resolve(name):
    assert broken_links(name) == []


def test_link_check_finds_a_broken_link_and_anchor(tmp_path, monkeypatch):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Its part\n")
    (tmp_path / "README.md").write_text("[ok](docs/a.md#its-part) [gone](docs/b.md) [bad](docs/a.md#nowhere)\n"
                                        "`[in code](docs/c.md)` [web](https://example.org/x)\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert broken_links("README.md") == [
        "README.md:1: docs/b.md: no such file", "README.md:1: docs/a.md#nowhere: no heading '#nowhere' in docs/a.md"
    ]


def is_generated(name, line):
    """A tool's own output (a file in a folder under docs/evidence/), or a table row: Markdown cannot wrap one, and a
    row that names a patch holds its name (up to 52 characters)."""
    return line.startswith("|") or (name.startswith("docs/evidence/") and name.count("/") > 2)


@pytest.mark.parametrize("name", DOCS)
def test_no_line_is_longer_than_300_characters(name):
    long = [
        number for number, line in enumerate((REPO / name).read_text().splitlines(), 1)
        if len(line) > LONGEST_LINE and not is_generated(name, line)
    ]
    assert long == [], f"{name}: lines {long} are longer than {LONGEST_LINE} characters"


def test_the_patch_tables_hold_every_patch_of_the_series_once_in_order():
    series = list(patch_facts.load().numbers)  # the patches' names, in series order
    rows, orders = patch_rows()
    assert sorted(name for order in orders for name in order) == sorted(series), \
        "the tables of docs/reference/patches_*.md must list every patch of patches/series once"
    for order in orders:
        assert order == [name for name in series if name in order], "each patch table keeps the series' order"


@pytest.mark.parametrize("tool", ["evidence-index", "upstream_coverage.py"])
def test_a_generated_page_says_what_its_sources_hold(tool):
    """docs/evidence/README.md (from the results files) and upstream_coverage.md (from patches/facts.toml)."""
    proc = subprocess.run([sys.executable, str(REPO / "tools" / tool), "--check"],
                          cwd=REPO,
                          stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT,
                          text=True)
    assert proc.returncode == 0, proc.stdout


def test_the_upstream_line_counts_a_test_by_its_side_by_side_rerun(monkeypatch):
    """A test the full tier counts as fixed because its two sides ran on different machines (a library on one
    only) is counted as its rerun on one machine found it: the line must not claim a fix the fork did not make."""
    import evidence_index

    identity = dict(fork_version="0.19.8+gafix.9", pristine_version="0.19.8", torch="2.13.0")
    counts = {"regression": 0, "fixed": 1, "both pass": 1, "both fail": 0, "both skip": 0}
    tests = {"a.py::t1": dict(category="fixed"), "a.py::t2": dict(category="both pass")}
    records = {
        "full/report.json": dict(sides=dict(fork=dict(run=2)), identity=identity, categories=counts, tests=tests),
        "rerun/report.json": dict(tests={"a.py::t1": dict(category="both pass")}),
    }
    monkeypatch.setattr(evidence_index, "load", records.__getitem__)
    monkeypatch.setattr(evidence_index, "UPSTREAM_FULL_RECORD", "full")
    monkeypatch.setattr(evidence_index, "UPSTREAM_FULL_RERUNS", ())
    assert "0 regressions, 1 fixed, 0 explained, 1 both pass" in evidence_index.upstream_full()
    monkeypatch.setattr(evidence_index, "UPSTREAM_FULL_RERUNS", ("rerun", ))
    assert "0 regressions, 0 fixed, 0 explained, 2 both pass" in evidence_index.upstream_full()


def test_every_docs_path_named_in_the_repository_exists():
    """Code, tests and pages name docs by path (docs/guides/gas_check.md in an error message): a moved page
    must take them along. (This file's own examples are made-up pages.)"""
    named = re.compile(r"(?<![\w/.])docs/[\w./-]+\.(?:md|json|jsonl)\b")
    texts = [
        name for name in repo_files()
        if name != "tests/test_docs.py" and (name.endswith((".py", ".md", ".txt",
                                                            ".toml")) or name.startswith("tools/"))
    ]
    missing = [
        f"{name}: {path}" for name in texts for path in named.findall((REPO / name).read_text(errors="replace"))
        if not (REPO / path).exists()
    ]
    assert missing == []
