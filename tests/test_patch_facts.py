# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""patches/facts.toml: every patch of the series has its facts, by name, and no code keys a fact by number."""

import ast

import pytest

from helpers.repo import REPO, python_files

import patch_facts

SERIES = [line for line in (REPO / "patches" / "series").read_text().split() if line.endswith(".patch")]
NUMBERS = {name[:4] for name in SERIES}


def number_literals(path, root=REPO):
    """String constants of ``path`` that are a patch number of the series ("0007") or begin one ("0007-...")."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            head = node.value[:5]
            if head[:4] in NUMBERS and (len(node.value) == 4 or head[4:] == "-"):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {node.value!r}")
    return found


def test_every_patch_has_its_facts_and_every_fact_its_patch():
    facts = patch_facts.load()
    assert set(facts.patches) == NUMBERS
    assert facts.not_for_upstream() == {SERIES[0][:4]}, "the fork's label, first in the series, only"


def test_no_code_names_a_patch_by_its_number():
    """A renumbering on the next rebase must not detach a fact from its patch: facts live in patches/facts.toml,
    keyed by name."""
    folders = ("tools", "tests", "gafix_build", "benchmarks")
    found = [
        literal for name in python_files() if name.split("/", 1)[0] in folders
        for literal in number_literals(REPO / name)
    ]
    assert found == []


def test_the_check_finds_a_number_and_a_bad_name(tmp_path):
    seeded = tmp_path / "tool.py"
    seeded.write_text(f"OVERLAY = {{{SERIES[6][:4]!r}: ('csrc/',)}}\n")
    assert len(number_literals(seeded, tmp_path)) == 1
    names = [patch_facts.patch_name(name) for name in SERIES]
    raw = {"patches": {name: {"upstream": "none found"} for name in names[1:]}, "upstream_tests": []}
    raw["patches"]["No-such-patch"] = {"upstream": "none found", "uncovered": "see {Nor-this-one}"}
    raw["upstream_tests"].append({"unit": "unit/test_x.py", "tier": "ci", "patches": [names[1]], "what": ""})
    found = "\n".join(patch_facts.problems(raw, names))
    assert f"no entry for patch {names[0]}" in found
    assert '[patches."No-such-patch"] names no patch of series' in found
    assert "{Nor-this-one}" in found
    assert "tier 'ci', not one of patch, full" in found


def test_docs_show_each_patchs_upstream_state():
    """The patch tables' upstream column (docs/reference/patches_*.md) is the facts' upstream, row by row."""
    from helpers.patch_tables import patch_rows
    facts = patch_facts.load()
    rows, _ = patch_rows()
    shown = {facts.numbers[name]: cells[2] for name, cells in rows.items()}
    assert shown == {number: facts.upstream(number) for number in facts.patches}


@pytest.mark.parametrize("name, expected",
                         [("9007-Let-the-CPU-accelerator-build.patch", "Let-the-CPU-accelerator-build"),
                          ("Already-a-name", "Already-a-name")])
def test_patch_name(name, expected):
    assert patch_facts.patch_name(name) == expected
