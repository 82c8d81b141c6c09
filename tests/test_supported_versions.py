# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The tested torch and Python range (gafix_build/supported.py): in the wheel's metadata, in README, and
backed by a version-matrix result for each of its corners (docs/evidence/version_matrix/results.json)."""

import importlib.metadata
import json

import pytest

from helpers.repo import REPO

from gafix_build.supported import PYTHON, TORCH, with_supported_versions
from gafix_build.supported import tested_range as supported_range  # not a test: pytest collects test*


def test_classifiers_name_the_tested_pythons_and_keep_the_rest():
    seen = {}
    with_supported_versions(lambda **kwargs: seen.update(kwargs))(
        description="DeepSpeed library",
        classifiers=["Programming Language :: Python :: 3.8", "License :: OSI Approved"],
        install_requires=["torch>=2.0.0"])
    assert seen["classifiers"] == [f"Programming Language :: Python :: {v}"
                                   for v in PYTHON] + ["License :: OSI Approved"]
    assert seen["description"].startswith("DeepSpeed library (") and supported_range() in seen["description"]
    assert seen["install_requires"] == ["torch>=2.0.0"], "the fork must not change the user's torch"


@pytest.mark.fork_only
def test_installed_wheel_states_the_range():
    meta = importlib.metadata.metadata("deepspeed")
    pythons = [
        c.rsplit(" :: ", 1)[1] for c in meta.get_all("Classifier") if c.startswith("Programming Language :: Python ::")
    ]
    assert pythons == list(PYTHON)
    assert supported_range() in meta["Summary"]


def test_readme_states_the_range():
    readme = (REPO / "README.md").read_text()
    assert f"Tested on torch {TORCH[0]} to {TORCH[-1]}, Python {PYTHON[0]} to {PYTHON[-1]}" in " ".join(readme.split())


@pytest.mark.slow
def test_each_corner_of_the_range_has_a_green_matrix_cell():
    """The claim is what the matrix measured: the oldest and newest torch (Python 3.11), and the oldest and
    newest Python (on the oldest torch), each with the whole suite passing and no patch-tier regression.

    A release gate (--run-slow, docs/develop/testing.md "Before a release"), not CI's: the matrix that writes its evidence
    runs for hours before a release, and CI checks the commits in between."""
    results = json.loads((REPO / "docs" / "evidence" / "version_matrix" / "results.json").read_text())
    corners = [(TORCH[0], "3.11"), (TORCH[-1], "3.11"), (TORCH[0], PYTHON[0]), (TORCH[0], PYTHON[-1])]
    for torch_version, python in corners:
        cell = results.get(f"{torch_version}@{python}")
        assert cell is not None, f"no version-matrix result for torch {torch_version}, Python {python}"
        assert "stage_failed" not in cell and cell["failed"] == 0 and cell["passed"] > 0, cell
        assert cell["patch_tier"] == "0 regressions", cell
