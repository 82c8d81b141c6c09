# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""A launch serves the tests pytest selected, no others (``helpers.selection``): ``-k`` and skip markers
narrow it, and a fixture's launch sees only the tests that use that fixture."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from helpers.repo import REPO

INNER = textwrap.dedent("""
    import json, os
    import pytest
    from helpers.selection import cases_by_ranks, selected_callspecs, selected_params

    CASES = [(2, "a"), (2, "b"), (4, "c"), pytest.param((4, "d"), marks=pytest.mark.skip(reason="slow"))]


    @pytest.fixture(scope="module")
    def launched(request):
        cases_for = cases_by_ranks(request, "launched", lambda name: name)
        with open(os.environ["SELECTION_OUT"], "w") as f:
            json.dump({"params": selected_params(request, "case", fixture="launched"),
                       "callspecs": [p["case"] for p in selected_callspecs(request, "launched")],
                       "ranks2": cases_for(2), "ranks4": cases_for(4)}, f)


    @pytest.fixture(scope="module")
    def other():
        pass


    @pytest.mark.parametrize("case", CASES, ids=lambda case: f"{case[0]}ranks-{case[1]}")
    def test_norm(launched, case):
        pass


    @pytest.mark.parametrize("case", CASES, ids=lambda case: f"{case[0]}ranks-{case[1]}")
    def test_update(launched, case):
        pass


    @pytest.mark.parametrize("case", [(2, "e")])
    def test_without_the_launch(other, case):
        pass
    """)


def selection(tmp_path, *args):
    (tmp_path / "test_inner.py").write_text(INNER)
    out = tmp_path / "selection.json"
    env = dict(os.environ, SELECTION_OUT=str(out), PYTHONPATH=str(REPO / "tests"))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, "test_inner.py"],
                         cwd=tmp_path,
                         env=env,
                         capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(out.read_text())


@pytest.mark.parametrize(
    "args, params, tests",
    [
        ([], [[2, "a"], [2, "b"], [4, "c"]], 2),  # the skipped case and the other fixture's test left out
        (["-k", "not 2ranks-b"], [[2, "a"], [4, "c"]], 2),
        (["-k", "test_update and 4ranks"], [[4, "c"]], 1),
    ],
    ids=["all", "deselected", "one-test"])
def test_launch_takes_the_selected_cases(tmp_path, args, params, tests):
    selected = selection(tmp_path, *args)
    assert selected["params"] == params
    # One set of parameters per selected test (``tests`` tests use each case), in collection order.
    assert selected["callspecs"] == params * tests
    assert selected["ranks2"] == [name for ranks, name in params if ranks == 2]
    assert selected["ranks4"] == [name for ranks, name in params if ranks == 4]
