# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Upstream DeepSpeed's own tests on the fork: the runner (tools/upstream_suite) and the patch tier.

The patch tier runs upstream's test files that exercise what our patches touch, on the installed fork,
and compares every outcome with pristine 0.19.8's, replayed from the recorded baseline
(tools/upstream_suite/baselines/patch.json). Any regression fails the test. In CI the upstream tests
directory must be there: a missing one fails instead of skipping.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.repo import REPO

from upstream_suite import baseline
from upstream_suite.classify import BOTH_FAIL, BOTH_PASS, BOTH_SKIP, EXPLAINED, FIXED, ONLY_FORK, REGRESSION
from upstream_suite.classify import category_of, compare
from upstream_suite.execute import Side, Unit, run_unit
from upstream_suite.outcomes import OutcomeMismatch, SideOutcomes


@pytest.mark.parametrize("fork, pristine, category", [
    ("passed", "passed", BOTH_PASS),
    ("failed", "passed", REGRESSION),
    ("error", "passed", REGRESSION),
    ("timeout", "passed", REGRESSION),
    ("crashed", "xfailed", REGRESSION),
    ("skipped", "passed", REGRESSION),
    ("failed", "skipped", REGRESSION),
    (None, "passed", REGRESSION),
    ("passed", "failed", FIXED),
    ("passed", "skipped", FIXED),
    ("failed", "error", BOTH_FAIL),
    ("skipped", "failed", BOTH_FAIL),
    ("skipped", "skipped", BOTH_SKIP),
    (None, "skipped", BOTH_SKIP),
    ("passed", None, ONLY_FORK),
    ("xpassed", "passed", REGRESSION),
    ("something new", "passed", REGRESSION),
])
def test_categories(fork, pristine, category):
    assert category_of(fork, pristine) == category


def test_compare_names_the_reason():
    fork = {"a": {"outcome": "failed", "reason": "AssertionError: 2 != 3"}, "b": {"outcome": "passed", "reason": ""}}
    pristine = {"a": {"outcome": "passed", "reason": ""}, "b": {"outcome": "passed", "reason": ""}}
    rows = compare(fork, pristine)
    assert [(row.test_id, row.category, row.reason) for row in rows] == [
        ("a", REGRESSION, "AssertionError: 2 != 3"),
        ("b", BOTH_PASS, ""),
    ]


def test_an_explained_pair_of_outcomes_is_not_a_regression_and_no_other_pair_is():
    """patches/facts.toml's [[explained]]: that test's exact fork and pristine outcomes are reported apart, with why;
    the same test with any other outcome on the fork is a regression again."""
    explained = {"a": ("skipped", "passed", "pristine passed having checked nothing")}
    pristine = {"a": {"outcome": "passed", "reason": ""}, "b": {"outcome": "passed", "reason": ""}}
    skipped = {"outcome": "skipped", "reason": "Skipped: no CUDA device available"}
    rows = compare({"a": skipped, "b": skipped}, pristine, explained)
    assert [(row.test_id, row.category, row.reason) for row in rows] == [
        ("a", EXPLAINED, "pristine passed having checked nothing"),
        ("b", REGRESSION, "Skipped: no CUDA device available"),
    ]
    failed = {"outcome": "failed", "reason": "AssertionError"}
    assert compare({"a": failed}, pristine, explained)[0].category == REGRESSION


def test_the_explained_differences_name_their_patch_and_a_test_of_the_tier():
    from patch_facts import load
    facts = load()
    tiered = {test.path for test in facts.upstream_tests}
    for entry in facts.explained:
        assert entry.patches and entry.why and entry.fork != entry.pristine
        assert entry.test.split("::")[0] in tiered, f"{entry.test}: no [[upstream_tests]] entry runs its file"


def test_a_file_pristine_cannot_collect_is_not_missing_on_the_fork():
    """Pristine's one outcome for a file it cannot import (a new module) is its collection error; the fork
    collects the file's tests: fixed when they pass, both-fail when one does not, never a regression.
    A file the fork cannot collect while pristine ran its tests stays a regression."""
    error = {"outcome": "error", "reason": "collection: ModuleNotFoundError"}
    passed, failed = {"outcome": "passed", "reason": ""}, {"outcome": "failed", "reason": "AssertionError"}
    rows = compare({"unit/t.py::a": passed, "unit/t.py::b": passed}, {"unit/t.py": error})
    assert [(row.test_id, row.category) for row in rows] == [("unit/t.py", FIXED), ("unit/t.py::a", ONLY_FORK),
                                                             ("unit/t.py::b", ONLY_FORK)]
    rows = compare({"unit/t.py::a": passed, "unit/t.py::b": failed}, {"unit/t.py": error})
    assert rows[0].category == BOTH_FAIL
    rows = compare({"unit/t.py": error}, {"unit/t.py::a": passed})
    assert {(row.test_id, row.category) for row in rows} == {("unit/t.py", ONLY_FORK), ("unit/t.py::a", REGRESSION)}
    assert compare({}, {"unit/t.py": error})[0].category == REGRESSION


def test_a_test_both_sides_fail_otherwise_is_listed_apart():
    """Failing on both sides is no regression, but the fork failing another way (another outcome, or another
    reason, numbers and each side's install path aside) may hide one: the report lists those with both reasons."""
    from upstream_suite import report

    def failed(reason, outcome="failed"):
        return {"outcome": outcome, "reason": reason}

    fork = {
        "alike": failed("RuntimeError: rank 1 at 0x7f3a: 524574720 bytes"),
        "earlier": failed("AssertionError: memory should decrease after offload"),
        "hangs": failed("", outcome="timeout"),
        "regression": failed("AssertionError"),
        "same_file":
        failed("ImportError: cannot import 'x' from 'deepspeed.a' (/v/fork/site-packages/deepspeed/a.py)"),
        "other_file": failed("KeyError: 'k' (/v/fork/lib/python3.11/site-packages/deepspeed/b.py)"),
    }
    pristine = {
        "alike": failed("RuntimeError: rank 0 at 0x7f9c: 521191424 bytes"),
        "earlier": failed("AssertionError: memory should increase after reload"),
        "hangs": failed("ValueError: Type fp16 is not supported"),
        "regression": {
            "outcome": "passed",
            "reason": ""
        },
        "same_file":
        failed("ImportError: cannot import 'x' from 'deepspeed.a' (/v/0.19.8/site-packages/deepspeed/a.py)"),
        "other_file": failed("KeyError: 'k' (/v/0.19.8/lib/python3.11/site-packages/deepspeed/c.py)"),
    }
    rows = {row.test_id: row for row in compare(fork, pristine)}
    assert {
        test_id: row.fork_reason
        for test_id, row in rows.items()
    } == {
        "alike": "",
        "earlier": "failed: AssertionError: memory should decrease after offload",
        "hangs": "timeout: ",
        "regression": "",
        "same_file": "",
        "other_file": "failed: KeyError: 'k' (/v/fork/lib/python3.11/site-packages/deepspeed/b.py)",
    }
    identity = {"fork_version": "f", "pristine_version": "p", "tests_sha256": "0" * 64, "torch": "t"}
    markdown = report.as_markdown("t", identity, list(rows.values()), fork, pristine, "run side by side")
    assert "3 of the 5 tests that fail on both sides fail otherwise on the fork" in markdown
    assert ("| `earlier` | failed: AssertionError: memory should decrease after offload | failed: AssertionError: "
            "memory should increase after reload |") in markdown
    assert "| `hangs` | timeout:  | failed: ValueError: Type fp16 is not supported |" in markdown
    assert json.loads(report.as_json(identity, list(rows.values()), fork, pristine,
                                     "s"))["both_fail_otherwise_on_the_fork"] == 3


SYNTHETIC_TESTS = '''
import os
import time

import pytest


def test_passes():
    pass


def test_fails():
    assert 1 == 2, "one is not two"


def test_skips():
    pytest.skip("not on this machine")


@pytest.mark.xfail(reason="known")
def test_xfails():
    assert False


def test_hangs():
    time.sleep(600)


def test_crashes():
    os._exit(3)


def test_after_the_crash():
    pass


@pytest.fixture
def broken():
    raise RuntimeError("fixture broke")


def test_setup_error(broken):
    pass
'''


def synthetic_tree(root):
    tests = root / "tests"
    (tests / "unit").mkdir(parents=True)
    (tests / "unit" / "test_synthetic.py").write_text(SYNTHETIC_TESTS)
    (tests / "unit" / "test_broken_import.py").write_text("import no_such_module_here\n")
    return tests


def test_runner_records_every_outcome_and_survives_hangs_and_crashes(tmp_path):
    tests = synthetic_tree(tmp_path)
    side = Side("fork", sys.executable, tmp_path / "ext", package_dir=str(tmp_path))
    outcomes = SideOutcomes(tmp_path / "results.json", {"who": "test"})
    for unit in (Unit("unit/test_synthetic.py"), Unit("unit/test_broken_import.py")):
        run_unit(side, unit, tests, outcomes, timeout_s=8, log_dir=tmp_path / "logs", local_size=0)
    got = {test_id.split("::")[-1]: result["outcome"] for test_id, result in outcomes.tests.items()}
    assert got == {
        "test_passes": "passed",
        "test_fails": "failed",
        "test_skips": "skipped",
        "test_xfails": "xfailed",
        "test_hangs": "timeout",
        "test_crashes": "crashed",
        "test_after_the_crash": "passed",
        "test_setup_error": "error",
        "unit/test_broken_import.py": "error",
    }
    reasons = {test_id.split("::")[-1]: result["reason"] for test_id, result in outcomes.tests.items()}
    assert "one is not two" in reasons["test_fails"]
    assert "not on this machine" in reasons["test_skips"]
    assert "no_such_module_here" in reasons["unit/test_broken_import.py"]

    # Resumed from its file: nothing runs again (a hang would cost another 8 s).
    resumed = SideOutcomes(tmp_path / "results.json", {"who": "test"})
    assert resumed.tests == outcomes.tests and resumed.done_units == outcomes.done_units
    with pytest.raises(OutcomeMismatch, match="who"):
        SideOutcomes(tmp_path / "results.json", {"who": "someone else"})


UPSTREAM_LIKE_COMMON = '''
def get_master_port(base_port=29500, port_range_size=1000):
    return str(base_port)  # upstream's: the first free port from 29500, alike in every process
'''

PORT_TEST = '''
import socket

from unit import common
from unit.gloo_utils import port_for_a_file_store


def test_master_port():
    port = common.get_master_port()
    assert port != "29500", "every process starts its search at 29500"
    with socket.socket() as sock:
        sock.bind(("", int(port)))


def test_master_port_of_a_module_that_imported_it_by_name():
    assert port_for_a_file_store() != "29500", "imported by name before the plugin swapped it in unit.common"
'''

# Like upstream's unit/v1/moe/autoep_test_utils.py: imported by name, when the test file is collected.
GLOO_UTILS = '''
from unit.common import get_master_port


def port_for_a_file_store():
    return get_master_port()
'''


def test_each_distributed_test_gets_a_master_port_the_os_chose(tmp_path):
    """Two pytest processes starting a DistributedTest at once took upstream's first free port from 29500 both
    (a prefix tier beside the full tier: one test hung to upstream's timeout): the plugin swaps in a port the OS
    chose, once ``unit.common`` is imported, there and in each module that imported upstream's by name (AutoEP's
    CPU/Gloo tests: the fork's and pristine's copies of one test shared /dev/shm buffers named after 29500)."""
    tests = tmp_path / "tests"
    (tests / "unit").mkdir(parents=True)
    (tests / "unit" / "__init__.py").write_text("")
    (tests / "unit" / "common.py").write_text(UPSTREAM_LIKE_COMMON)
    (tests / "unit" / "gloo_utils.py").write_text(GLOO_UTILS)
    (tests / "unit" / "test_port.py").write_text(PORT_TEST)
    side = Side("fork", sys.executable, tmp_path / "ext", package_dir=str(tmp_path))
    outcomes = SideOutcomes(tmp_path / "results.json", {"who": "test"})
    run_unit(side, Unit("unit/test_port.py"), tests, outcomes, timeout_s=60, log_dir=tmp_path / "logs", local_size=0)
    assert [result["outcome"] for result in outcomes.tests.values()] == ["passed", "passed"], outcomes.tests


# What describe_python reports of two machines: upstream's tests skip on their differences.
INTEL = {"cpu_vendor": "genuineintel", "dtypes": ["torch.float32", "torch.bfloat16", "torch.float16"]}
AMD = {"cpu_vendor": "authenticamd", "dtypes": ["torch.float32", "torch.bfloat16"]}


def test_a_fork_built_from_another_commit_resumes_but_other_code_or_packages_do_not(tmp_path):
    """The full tier takes several runs, on whatever machine each gets: the same code built from another
    commit (only the build's git stamp differs) resumes; a changed module or package does not, and the
    refusal names the packages that differ and how to install the recorded ones."""
    from upstream_suite.cli import side_identity
    package = tmp_path / "deepspeed"
    package.mkdir()
    (package / "engine.py").write_text("x = 1\n")
    (package / "git_version_info_installed.py").write_text("git_hash = 'abc'\n")
    identity = {key: "same" for key in baseline.KEYS}
    info = {
        "deepspeed": "0.19.8+gafix.3",
        "packages": ["tabulate==0.10.0", "torch==2.13.0+cpu"],
        "ops": {},
        "machine": INTEL
    }
    recorded = side_identity(identity, info, package)
    SideOutcomes(tmp_path / "results.json", recorded).save()

    (package / "git_version_info_installed.py").write_text("git_hash = 'def'\ngit_branch = 'other'\n")
    SideOutcomes(tmp_path / "results.json", side_identity(identity, info, package))  # resumes
    with pytest.raises(OutcomeMismatch, match=r"only recorded \['tabulate==0.10.0'\].*pip install tabulate==0.10.0"):
        SideOutcomes(tmp_path / "results.json",
                     side_identity(identity, dict(info, packages=["torch==2.13.0+cpu"]), package))
    (package / "engine.py").write_text("x = 2\n")
    with pytest.raises(OutcomeMismatch, match="package_sha256"):
        SideOutcomes(tmp_path / "results.json", side_identity(identity, info, package))


def test_a_machine_that_builds_other_ops_does_not_resume_nor_replay_the_record(tmp_path):
    """A test that needs an op skips where the machine cannot build it (async_io without libaio): outcomes from a
    machine that built it, resumed or replayed on one that cannot (or the other way), would differ for that
    alone and read as fixes or regressions. An op only one side has (the fork's fused_norm) is no difference."""
    from upstream_suite.cli import side_identity
    package = tmp_path / "deepspeed"
    package.mkdir()
    (package / "engine.py").write_text("x = 1\n")
    shared = identity(pristine_version="0.19.8")
    with_libaio = {"async_io": True, "cpu_adam": True}
    info = {"deepspeed": "0.19.8", "packages": ["torch==2.13.0+cpu"], "ops": with_libaio, "machine": INTEL}
    path = tmp_path / "results-pristine.json"
    outcomes = SideOutcomes(path, side_identity(shared, info, package))
    outcomes.record("unit/a.py::t", "passed", "", 1.0, "unit/a.py")
    outcomes.mark_done("unit/a.py")

    without_libaio = dict(with_libaio, async_io=False)
    with pytest.raises(OutcomeMismatch, match="ops: async_io recorded True, now False"):
        SideOutcomes(path, side_identity(shared, dict(info, ops=without_libaio), package))
    fork_ops = dict(with_libaio, fused_norm=True)
    assert baseline.load(path, shared, ["unit/a.py"], fork_ops, INTEL) == (outcomes.tests, with_libaio, INTEL)
    with pytest.raises(baseline.BaselineError, match="async_io builds there, does not here.*libaio-dev"):
        baseline.load(path, shared, ["unit/a.py"], dict(fork_ops, async_io=False), INTEL)

    recorded = tmp_path / "patch.json"
    baseline.record(recorded, shared, outcomes, ["unit/a.py"])
    assert baseline.load(recorded, shared, ["unit/a.py"], fork_ops, INTEL)[1] == with_libaio
    with pytest.raises(baseline.BaselineError, match="async_io"):
        baseline.load(recorded, shared, ["unit/a.py"], dict(fork_ops, async_io=False), INTEL)


def test_another_cpu_vendor_or_dtypes_does_not_resume_nor_replay_the_record(tmp_path):
    """Upstream's tests skip fp16 where the CPU accelerator lacks it, and cpu_adam's and cpu_lion's half precision
    on AMD: pristine's outcomes from an AMD machine replayed on an Intel one read as dozens of regressions and
    fixes that are none. Either difference refuses a resume and a replay; a record without it replays."""
    from upstream_suite.cli import side_identity
    package = tmp_path / "deepspeed"
    package.mkdir()
    (package / "engine.py").write_text("x = 1\n")
    shared = identity(pristine_version="0.19.8")
    info = {"deepspeed": "0.19.8", "packages": ["torch==2.13.0+cpu"], "ops": {}, "machine": AMD}
    path = tmp_path / "results-pristine.json"
    outcomes = SideOutcomes(path, side_identity(shared, info, package))
    outcomes.record("unit/a.py::t", "skipped", "not supported on AMD CPUs", 1.0, "unit/a.py")
    outcomes.mark_done("unit/a.py")

    with pytest.raises(OutcomeMismatch, match="machine: cpu_vendor recorded 'authenticamd', now 'genuineintel'"):
        SideOutcomes(path, side_identity(shared, dict(info, machine=INTEL), package))
    with pytest.raises(baseline.BaselineError, match="CPU vendor authenticamd.*here CPU vendor genuineintel"):
        baseline.load(path, shared, ["unit/a.py"], {}, INTEL)
    with pytest.raises(baseline.BaselineError, match="another kind of machine"):  # fp16 alone
        baseline.load(path, shared, ["unit/a.py"], {}, dict(AMD, dtypes=INTEL["dtypes"]))
    assert baseline.load(path, shared, ["unit/a.py"], {}, dict(AMD, dtypes=AMD["dtypes"][::-1]))[2] == AMD

    recorded = tmp_path / "patch.json"
    baseline.record(recorded, shared, outcomes, ["unit/a.py"])
    assert baseline.load(recorded, shared, ["unit/a.py"], {}, AMD)[2] == AMD
    with pytest.raises(baseline.BaselineError, match="another kind of machine"):
        baseline.load(recorded, shared, ["unit/a.py"], {}, INTEL)


def test_an_unfinished_unit_resumes_without_rerunning_what_has_an_outcome(tmp_path):
    tests = synthetic_tree(tmp_path)
    side = Side("fork", sys.executable, tmp_path / "ext", package_dir=str(tmp_path))
    outcomes = SideOutcomes(tmp_path / "results.json", {"who": "test"})
    hang_id = "unit/test_synthetic.py::test_hangs"
    outcomes.record(hang_id, "timeout", "killed in an earlier run", 8.0, "unit/test_synthetic.py")
    run_unit(side,
             Unit("unit/test_synthetic.py"),
             tests,
             outcomes,
             timeout_s=60,
             log_dir=tmp_path / "logs",
             local_size=0)
    assert outcomes.tests[hang_id]["reason"] == "killed in an earlier run"
    assert outcomes.tests["unit/test_synthetic.py::test_after_the_crash"]["outcome"] == "passed"


def test_a_regression_runs_again_once_on_the_record(tmp_path):
    """A test that timed out on the fork side only while other jobs had the machine runs again with
    --rerun-regressions: its first outcome goes to reruns-fork.json (the report counts it), its file resumes
    with that test alone, and the second outcome is the one compared."""
    from upstream_suite import reruns
    tests = synthetic_tree(tmp_path)
    unit = "unit/test_synthetic.py"
    fork = SideOutcomes(tmp_path / "results-fork.json", {"who": "fork"})
    pristine = SideOutcomes(tmp_path / "results-pristine.json", {"who": "pristine"})
    outcomes = {
        "passes": "passed",
        "fails": "failed",
        "skips": "skipped",
        "xfails": "xfailed",
        "hangs": "timeout",
        "crashes": "crashed",
        "after_the_crash": "passed"
    }
    for name, outcome in outcomes.items():
        pristine.record(f"{unit}::test_{name}", outcome, "", 1.0, unit)
        fork.record(f"{unit}::test_{name}", "timeout" if name == "passes" else outcome, "killed", 300.0, unit)
    fork.mark_done(unit)
    pristine.mark_done(unit)
    assert reruns.take_regressions(fork, pristine, tmp_path) == [f"{unit}::test_passes"]
    assert f"{unit}::test_passes" not in fork.tests and unit not in fork.done_units
    run_unit(Side("fork", sys.executable, tmp_path / "ext", package_dir=str(tmp_path)),
             Unit(unit),
             tests,
             fork,
             timeout_s=60,
             log_dir=tmp_path / "logs",
             local_size=0)
    assert fork.tests[f"{unit}::test_passes"]["outcome"] == "passed"
    assert fork.tests[f"{unit}::test_hangs"]["reason"] == "killed"  # not run again
    assert not [row for row in compare(fork.tests, pristine.tests) if row.category == REGRESSION]
    assert "1 fork outcome(s), first 1 timeout" in reruns.summary(tmp_path)
    assert reruns.take_regressions(fork, pristine, tmp_path) == []


RUN_ONE_UNIT = """
import sys
from pathlib import Path
from upstream_suite.execute import Side, Unit, run_unit
from upstream_suite.outcomes import SideOutcomes
root = Path(sys.argv[1])
outcomes = SideOutcomes(root / "results.json", {"who": "test"})
run_unit(Side("fork", sys.executable, root / "ext", str(root)), Unit("unit/test_synthetic.py"), root / "tests", outcomes,
         timeout_s=600, log_dir=root / "logs", local_size=0)
"""


def orphans(root):
    """Processes still running in the synthetic tree (the runner's pytest children)."""
    import psutil
    found = []
    for proc in psutil.process_iter(["cwd"]):
        if (proc.info.get("cwd") or "").startswith(str(root)):
            found.append(proc.pid)
    return found


def test_outcomes_are_kept_when_the_runner_is_killed_inside_a_file(tmp_path):
    """A long tier is stopped wherever it is (a session ends): what finished before must be on disk."""
    synthetic_tree(tmp_path)
    runner = subprocess.Popen([sys.executable, "-c", RUN_ONE_UNIT, str(tmp_path)], start_new_session=True)
    results = tmp_path / "results.json"
    xfails = "unit/test_synthetic.py::test_xfails"  # the last test before test_hangs (which sleeps 600 s)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (results.exists() and xfails in results.read_text()):
            time.sleep(0.5)
    finally:
        os.killpg(runner.pid, signal.SIGKILL)
        runner.wait()
    assert results.exists(), "nothing was written while the file ran: a killed runner loses the whole file"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and orphans(tmp_path):
        time.sleep(0.2)
    assert not orphans(tmp_path), "the runner's pytest process outlived it"
    kept = json.loads(results.read_text())["tests"]
    assert {"unit/test_synthetic.py::test_passes", "unit/test_synthetic.py::test_fails", xfails} <= set(kept)
    assert "unit/test_synthetic.py::test_hangs" not in kept


def identity(**changes):
    keys = dict.fromkeys(baseline.KEYS, "x")
    keys.update(changes)
    return keys


def test_baseline_is_refused_for_another_setup_or_a_missing_unit(tmp_path):
    outcomes = SideOutcomes(None, {})
    outcomes.record("unit/a.py::t", "passed", "", 1.0, "unit/a.py")
    outcomes.mark_done("unit/a.py")
    path = tmp_path / "patch.json"
    baseline.record(path, identity(), outcomes, ["unit/a.py"])
    assert baseline.load(path, identity(), ["unit/a.py"], {}, INTEL)[0] == {
        "unit/a.py::t": outcomes.tests["unit/a.py::t"]
    }
    with pytest.raises(baseline.BaselineError, match="tests_sha256"):
        baseline.load(path, identity(tests_sha256="y"), ["unit/a.py"], {}, INTEL)
    with pytest.raises(baseline.BaselineError, match="pin_sha256"):
        baseline.load(path, identity(pin_sha256="y"), ["unit/a.py"], {}, INTEL)
    with pytest.raises(baseline.BaselineError, match="lacks 1 unit"):
        baseline.load(path, identity(), ["unit/a.py", "unit/b.py"], {}, INTEL)
    with pytest.raises(baseline.BaselineError, match="did not finish"):
        baseline.record(path, identity(), outcomes, ["unit/a.py", "unit/b.py"])


def test_a_finished_pristine_results_file_replays_as_a_baseline(tmp_path):
    """A full tier's results-pristine.json serves as its baseline; a fork's results file, or an unfinished one, not."""
    recorded = {key: "x" for key in baseline.KEYS if key != "pristine_version"}
    path = tmp_path / "results-pristine.json"
    outcomes = SideOutcomes(path, dict(recorded, deepspeed="0.19.8", packages=["torch==2.13.0"]))
    outcomes.record("unit/a.py::t", "passed", "", 1.0, "unit/a.py")
    outcomes.mark_done("unit/a.py")
    # Recorded before results kept the ops and the machine: it replays, saying it does not know them.
    assert baseline.load(path, identity(pristine_version="0.19.8"), ["unit/a.py"], {},
                         INTEL) == (outcomes.tests, None, None)
    with pytest.raises(baseline.BaselineError, match="lacks 1 unit"):
        baseline.load(path, identity(pristine_version="0.19.8"), ["unit/a.py", "unit/b.py"], {}, INTEL)
    fork = tmp_path / "results-fork.json"
    SideOutcomes(fork, dict(recorded, deepspeed="0.19.8+gafix.4")).mark_done("unit/a.py")
    with pytest.raises(baseline.BaselineError, match="pristine_version"):
        baseline.load(fork, identity(pristine_version="0.19.8"), ["unit/a.py"], {}, INTEL)


def test_tree_hash_follows_content(tmp_path):
    tests = synthetic_tree(tmp_path)
    before = baseline.tree_sha256(tests)
    (tests / "unit" / "__pycache__").mkdir()
    (tests / "unit" / "__pycache__" / "x.pyc").write_bytes(b"cache")
    # A pytest run inside the tree leaves .pytest_cache (it once made CI's baseline look stale).
    (tests / ".pytest_cache" / "v" / "cache").mkdir(parents=True)
    (tests / ".pytest_cache" / "v" / "cache" / "nodeids").write_text("[]")
    assert baseline.tree_sha256(tests) == before
    (tests / "unit" / "test_synthetic.py").write_text(SYNTHETIC_TESTS + "\n")
    assert baseline.tree_sha256(tests) != before


def upstream_tests_or_skip():
    from upstream_suite.cli import SetupError, upstream_tests_dir
    try:
        return upstream_tests_dir(None)
    except SetupError as err:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run upstream's patch tier: {err}")
        pytest.skip(str(err))


def run_tier(tier_args, tmp_path, extensions_dir, report):
    """tools/run-upstream-suite with ``tier_args``, the fork's ops from ``extensions_dir``; must exit 0."""
    proc = subprocess.run([
        sys.executable,
        str(REPO / "tools" / "run-upstream-suite"), *tier_args, "--work-dir",
        str(tmp_path / "work"), "--fork-extensions-dir",
        str(extensions_dir), "--report",
        str(report), "--timeout", "300"
    ],
                          stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT,
                          text=True)
    print(proc.stdout[-20000:])
    assert proc.returncode == 0, proc.stdout[-6000:]


@pytest.mark.fork_only
def test_patch_tier_has_no_regression(tmp_path, extensions_dir):
    """Upstream's tests of what the patches touch: fork vs pristine 0.19.8's recorded outcomes.

    The fork side loads its ops from the run's extensions directory, where this install built them
    already in CI (the demo): their JIT builds would cost the patch tier minutes.
    """
    upstream_tests_or_skip()
    report = tmp_path / "patch-tier.md"
    # Pristine's side replays its recorded outcomes where they were recorded on this torch and Python, on a
    # machine that builds the same ops, of the same CPU vendor and dtypes; elsewhere (the version matrix, a machine
    # without libaio, an AMD CPU) it runs, in
    # the venv on this torch: a baseline from another torch would compare two torches, and a stale one for
    # any other reason must fail here.
    import torch
    from upstream_suite.cli import describe_python
    recorded = json.loads(baseline.default_path("patch").read_text())
    here = {"torch": torch.__version__, "python": "%d.%d" % sys.version_info[:2]}
    probe = describe_python(sys.executable)
    same_ops = not baseline.ops_differing(recorded.get("ops") or {}, probe["ops"])
    same_machine = not baseline.machine_differs(recorded.get("machine"), probe["machine"])
    if same_ops and same_machine and all(recorded["keys"][key] == value for key, value in here.items()):
        pristine = ["--pristine-baseline"]
    else:
        from helpers.pristine import pristine_python
        pristine = ["--pristine-python", pristine_python()]
    # Two files at once: CI's 2 cores are about half idle with one distributed test at a time.
    run_tier(["--tier", "patch", *pristine, "--jobs", "2"], tmp_path, extensions_dir, report)
    summary = json.loads(report.with_suffix(".json").read_text())
    assert summary["categories"]["regression"] == 0
    assert summary["sides"]["fork"]["passed"] > 0, "the patch tier ran no passing test: nothing was checked"


@pytest.mark.slow
@pytest.mark.fork_only
def test_each_patch_test_fails_on_pristine_and_passes_on_the_fork(tmp_path, extensions_dir):
    """The patch-tests tier: every patch's own upstream-style test, in upstream's harness, run on pristine
    0.19.8 and on the fork (about 12 minutes here; results in docs/develop/patches.md)."""
    upstream_tests_or_skip()
    from helpers.pristine import pristine_python
    report = tmp_path / "patch-tests" / "report.md"
    run_tier(["--tier", "patch-tests", "--pristine-python", pristine_python()], tmp_path, extensions_dir, report)
    assert "fails on pristine, passes on the fork" in (report.parent / "patch-tests.md").read_text()


def test_patch_tier_files_exist_upstream():
    """Every file the patch tier names is in upstream's tests (a renamed file must not drop out silently)."""
    tests = upstream_tests_or_skip()
    from upstream_suite.tiers import PATCH_TIER
    missing = [covered.unit.path for covered in PATCH_TIER if not (Path(tests) / covered.unit.path).is_file()]
    assert not missing


def test_runner_refuses_a_missing_tests_directory(tmp_path):
    proc = subprocess.run(
        [sys.executable,
         str(REPO / "tools" / "run-upstream-suite"), "--tests",
         str(tmp_path / "nowhere")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True)
    assert proc.returncode == 2 and "no upstream tests directory" in proc.stdout, proc.stdout


def test_a_second_run_in_a_busy_work_dir_is_refused_and_a_report_touches_no_tree(tmp_path):
    """A report started while the full tier ran rebuilt the tier's scratch tree under its running pytest
    (the series had gained a patch test): two tests then failed on the fork side only, with FileNotFoundError
    from os.getcwd(), and read as regressions. A run now holds its work directory; a report needs no lock
    and leaves the trees alone."""
    from upstream_suite import work_dir_lock
    tests = synthetic_tree(tmp_path)
    (tests / "unit" / "common.py").write_text("")  # what marks an upstream tests directory
    work_dir = tmp_path / "work"
    tree = work_dir / "tree-fork"
    tree.mkdir(parents=True)
    (tree / "SHA256").write_text("a stamp from another series")
    (tree / "in-use").write_text("a running test's files")

    def runner(*extra):
        return subprocess.run([
            sys.executable,
            str(REPO / "tools" / "run-upstream-suite"), "--tests",
            str(tests), "--work-dir",
            str(work_dir), "--fork-python", sys.executable, "--only", "fork", "--files", "unit/test_synthetic.py",
            *extra
        ],
                              stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT,
                              text=True)

    with work_dir_lock.hold(work_dir):
        busy = runner()
        report = runner("--report-only")
    assert busy.returncode == 2 and f"is running in {work_dir}" in busy.stdout, busy.stdout
    assert report.returncode == 0, report.stdout
    assert (tree / "in-use").exists() and (tree / "SHA256").read_text() == "a stamp from another series"


def test_each_side_runs_its_own_deepspeed_launcher(tmp_path):
    """Upstream's launcher tests run `deepspeed` from PATH: with neither side's venv on it they failed on
    both sides alike ("No such file or directory: 'deepspeed'") and read as upstream's own state. Each side's
    pytest now gets its interpreter's directory first on PATH; a venv copied with `cp -a`, whose launcher
    runs the original venv's python (the other install), is refused."""
    from upstream_suite import console_scripts
    from upstream_suite.execute import child_environ
    venv, original = tmp_path / "copy" / "bin", tmp_path / "original" / "bin"
    venv.mkdir(parents=True)
    python = venv / "python"
    python.symlink_to(sys.executable)
    assert "is missing" in console_scripts.problem(str(python))
    launcher = venv / "deepspeed"
    launcher.write_text(f"#!{original}/python3\nimport sys\n")
    assert "a copied venv" in console_scripts.problem(str(python)), console_scripts.problem(str(python))
    launcher.write_text(f"#!{venv}/python3\nimport sys\n")
    assert console_scripts.problem(str(python)) is None
    # pip's form for an interpreter path too long for a '#!' line
    launcher.write_text("#!/bin/sh\n'''exec' " + f'{original}/python3 "$0" "$@"' + "\n' '''\n")
    assert console_scripts.interpreter_of(launcher) == f"{original}/python3"
    side = Side("fork", str(python), tmp_path / "ext", str(tmp_path))
    assert child_environ(side, tmp_path / "events", 60, 8)["PATH"].split(os.pathsep)[0] == str(venv)


def test_a_build_lock_left_by_a_killed_build_is_removed_before_the_next_test_process(tmp_path):
    """A JIT build killed mid-way leaves <op>/lock; torch then waits for it forever in every later test."""
    tests = synthetic_tree(tmp_path)
    extensions = tmp_path / "ext"
    (extensions / "some_op").mkdir(parents=True)
    (extensions / "some_op" / "lock").write_text("")
    (extensions / "some_op" / "some_op.so").write_text("")
    side = Side("fork", sys.executable, extensions, package_dir=str(tmp_path))
    outcomes = SideOutcomes(tmp_path / "results.json", {"who": "test"})
    run_unit(side, Unit("unit/test_synthetic.py", "test_passes"), tests, outcomes, 60, tmp_path / "logs", 0)
    assert outcomes.tests["unit/test_synthetic.py::test_passes"]["outcome"] == "passed"
    assert not (extensions / "some_op" / "lock").exists()
    assert (extensions / "some_op" / "some_op.so").exists(), "only the lock goes"
    log = next((tmp_path / "logs").glob("*.fork.log")).read_text()
    assert "removed a JIT build lock left by a killed build" in log


def _holding(path):
    """A process that holds ``path`` open, as torch's build holds its lock and a comm rank its buffer."""
    holder = subprocess.Popen([
        sys.executable, "-c", f"import os, sys, time; os.open({str(path)!r}, os.O_RDONLY); print(1, flush=True); "
        "time.sleep(120)"
    ],
                              stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout.readline().strip() == "1"
    return holder


@pytest.mark.parametrize("left", ["deepspeed_allreduce_buffer_127.0.0.1_29500_0", "sem.mp-k3x9q2w1"])
def test_a_lock_or_buffer_a_running_process_holds_stays_and_one_left_by_a_dead_process_goes(tmp_path, left):
    """``--jobs`` and the two sides run pytest processes beside each other: a JIT build lock or /dev/shm comm
    buffer (or a multiprocessing pool's semaphore) made while one ran may be another's, still in use (a rank not yet
    attached to a buffer removed under it spins forever). What goes is what no process holds; other files in
    /dev/shm are not ours to remove."""
    from upstream_suite.execute import remove_left_shm_buffers, remove_stale_build_locks
    from upstream_suite.held_files import held_paths
    lock = tmp_path / "ext" / "some_op" / "lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("")
    shm = tmp_path / "shm"  # not /dev/shm: the names there may be a running test's
    shm.mkdir()
    buffer = shm / left
    buffer.write_bytes(b"\0" * 64)
    (shm / "torch_12345_67890").write_bytes(b"\0")  # another program's
    holders = [_holding(lock), _holding(buffer)]
    try:
        assert remove_stale_build_locks(tmp_path / "ext", held_paths()) == []
        assert buffer.name not in remove_left_shm_buffers(set(), held_paths(), shm)
        assert lock.exists() and buffer.exists()
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()
    assert remove_stale_build_locks(tmp_path / "ext", held_paths()) == [lock]
    assert buffer.name in remove_left_shm_buffers(set(), held_paths(), shm)
    assert not lock.exists() and not buffer.exists()
    # Without /proc nothing is known: every lock, and the buffers made since the process started, go.
    lock.write_text("")
    buffer.write_bytes(b"\0")
    assert remove_stale_build_locks(tmp_path / "ext", None) == [lock]
    assert remove_left_shm_buffers({buffer.name}, None, shm) == [] and buffer.exists()
    assert remove_left_shm_buffers(set(), None, shm) == [buffer.name] and not buffer.exists()
    assert (shm / "torch_12345_67890").exists()


OVERLAP_TEST = """
import os
import time


def test_{name}():
    started = time.time()
    time.sleep(4)
    with open({record!r}, "a") as record:
        record.write(f"{{started}} {{time.time()}} {{os.getcwd()}}\\n")
"""


def test_jobs_run_test_files_at_once_each_in_a_tree_of_its_own(tmp_path):
    """``--jobs 2``: the full tier on 2 cores left half the machine idle with one pytest process at a time."""
    tests = tmp_path / "tests"
    (tests / "unit").mkdir(parents=True)
    (tests / "unit" / "common.py").write_text("")
    record = tmp_path / "record.txt"
    for name in ("first", "second"):
        (tests / "unit" / f"test_{name}.py").write_text(OVERLAP_TEST.format(name=name, record=str(record)))
    work_dir = tmp_path / "work"
    proc = subprocess.run([
        sys.executable,
        str(REPO / "tools" / "run-upstream-suite"), "--tests",
        str(tests), "--work-dir",
        str(work_dir), "--fork-python", sys.executable, "--only", "fork", "--jobs", "2", "--files",
        "unit/test_first.py", "unit/test_second.py"
    ],
                          stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT,
                          text=True)
    assert proc.returncode == 0, proc.stdout
    outcomes = json.loads((work_dir / "results-fork.json").read_text())
    assert {
        test_id: result["outcome"]
        for test_id, result in outcomes["tests"].items()
    } == {
        "unit/test_first.py::test_first": "passed",
        "unit/test_second.py::test_second": "passed",
    }
    assert sorted(outcomes["done_units"]) == ["unit/test_first.py", "unit/test_second.py"]
    runs = [line.split() for line in record.read_text().splitlines()]
    assert max(float(started) for started, _, _ in runs) < min(float(ended) for _, ended, _ in runs), runs
    assert {cwd
            for _, _, cwd in runs} == {str(work_dir / "tree-fork" / "tests"),
                                       str(work_dir / "tree-fork.2" / "tests")}


def _created(path, lines, newline_at_end=True):
    """The diff of a format-patch that creates ``path`` with ``lines``."""
    body = "".join(f"+{line}\n" for line in lines) + ("" if newline_at_end else "\\ No newline at end of file\n")
    return (f"diff --git a/{path} b/{path}\nnew file mode 100644\nindex 0000000..1111111\n--- /dev/null\n"
            f"+++ b/{path}\n@@ -0,0 +1,{len(lines)} @@\n{body}")


def _changed(path):
    return (f"diff --git a/{path} b/{path}\nindex 1111111..2222222 100644\n--- a/{path}\n+++ b/{path}\n"
            "@@ -1,1 +1,1 @@\n-old\n+new\n")


def test_patch_tests_are_read_back_from_the_diffs(tmp_path):
    """The patch-tests tier lays in exactly the test files the patches create (not their other files, not
    test helpers), and refuses a patch that changes a test file an earlier patch added."""
    from upstream_suite.patch_tests import PatchTestError, patch_tests
    lines = ["# SPDX-License-Identifier: Apache-2.0", "", "def test_it():", "    assert '+1' != '-- '"]
    first = tmp_path / "9002-Fix-one.patch"
    first.write_text("Subject: [PATCH] Fix one\n\n---\n" + _changed("deepspeed/runtime/engine.py") +
                     _created("tests/unit/runtime/test_one.py", lines) + _created("tests/unit/helper.py", ["x = 1"]) +
                     _created("tests/unit/test_two.py", ["x = 2"], newline_at_end=False))
    found = patch_tests([first])
    assert [(t.number, t.path) for t in found] == [("9002", "unit/runtime/test_one.py"), ("9002", "unit/test_two.py")]
    assert found[0].content == "\n".join(lines) + "\n" and found[1].content == "x = 2"
    later = tmp_path / "9003-Fix-two.patch"
    later.write_text("Subject: [PATCH] Fix two\n\n---\n" + _changed("tests/unit/runtime/test_one.py"))
    with pytest.raises(PatchTestError, match="9003-Fix-two.patch changes tests/unit/runtime/test_one.py"):
        patch_tests([first, later])
    cut = tmp_path / "9004-Cut.patch"
    cut.write_text("".join(_created("tests/unit/test_cut.py", lines).splitlines(keepends=True)[:-1]))
    with pytest.raises(PatchTestError, match="cut short"):
        patch_tests([cut])


def test_every_patch_for_upstream_carries_a_test_that_compiles():
    """The series' own tests as the tier reads them: one or more per patch but the fork's label,
    each valid Python in upstream's layout (tests/unit/..., a DistributedTest or a plain test)."""
    from patch_facts import load as load_facts
    from upstream_suite.patch_tests import patch_tests
    series = (REPO / "patches" / "series").read_text().split()
    patches = [REPO / "patches" / name for name in series if name.endswith(".patch")]
    found = patch_tests(patches)
    assert {t.number for t in found} == {p.name[:4] for p in patches} - load_facts().not_for_upstream()
    for test in found:
        assert test.path.startswith("unit/"), test.path
        compile(test.content, test.path, "exec")


@pytest.mark.slow
@pytest.mark.fork_only
def test_each_patch_passes_its_test_with_only_the_patches_before_it(tmp_path, extensions_dir):
    """The prefixes tier: the PR bundles applied one by one on pristine 0.19.8 (git am), and after each,
    that patch's own upstream-style test on the tree so far (about 25 minutes here; docs/develop/patches.md)."""
    upstream_tests_or_skip()
    from helpers.pristine import pristine_python
    report = tmp_path / "prefixes.md"
    run_tier(["--tier", "prefixes", "--pristine-python", pristine_python()], tmp_path, tmp_path / "ext", report)
    assert "| passes |" in report.read_text()


def test_a_prefix_runs_its_own_package_and_fails_unless_every_test_of_its_patch_passed(tmp_path):
    """A prefix's package comes first on the path of every process it starts; its verdict fails on a
    failed, errored or missing test of its patch (a patch whose test needs a later patch fails here); skipped
    cases count for neither side."""
    from upstream_suite.execute import child_environ
    from upstream_suite.patch_tests import PatchTest
    from upstream_suite.prefixes import Prefix, as_markdown, every_case_skipped, prefixes, side_of, verdict
    bundles = [tmp_path / name for name in ("9001-Label", "9002-Fix-one", "9003-Fix-two")]
    tests = [PatchTest("9002-Fix-one", "unit/test_one.py", ""), PatchTest("9003-Fix-two", "unit/test_two.py", "")]
    found = prefixes(bundles, tests, not_for_upstream=("9001", ))
    assert [(p.number, [t.path for t in p.tests]) for p in found] == [("9002", ["unit/test_one.py"]),
                                                                      ("9003", ["unit/test_two.py"])]
    side = side_of(found[0], sys.executable, tmp_path / "site", tmp_path / "ext")
    env = child_environ(side, tmp_path / "events", 60, 8)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path / "site")
    assert side.package_dir == str(tmp_path / "site" / "deepspeed")

    def outcomes(*results):
        recorded = SideOutcomes(None, {})
        for test_id, outcome in results:
            recorded.record(test_id, outcome, "", 0.0, test_id.split("::")[0])
        return recorded

    two = Prefix("9003", bundles[2], (tests[1], PatchTest("9003-Fix-two", "unit/test_three.py", "")))
    passed = ("unit/test_two.py::test_a", "passed"), ("unit/test_three.py::test_b", "passed")
    assert verdict(two, outcomes(*passed))[1]
    assert not verdict(two, outcomes(passed[0], ("unit/test_three.py::test_b", "failed")))[1]
    assert not verdict(two, outcomes(passed[0], ("unit/test_three.py::test_b", "error")))[1]
    assert not verdict(two, outcomes(passed[0]))[1], "a test file that did not run is no pass"
    assert not verdict(two, outcomes())[1]
    # A case that needs a device this machine lacks is no evidence: the cases that ran decide, and a patch whose
    # every case skipped is not run here, which is neither a pass nor a failure.
    skipped = ("unit/test_three.py::test_c", "skipped")
    assert verdict(two, outcomes(*passed, skipped))[1]
    assert not verdict(two, outcomes(passed[0], ("unit/test_three.py::test_b", "failed"), skipped))[1]
    only_skips = verdict(two, outcomes(("unit/test_two.py::test_a", "skipped"), skipped))
    assert not only_skips[1] and every_case_skipped(only_skips[0])
    table = as_markdown([(two, *only_skips), (two, *verdict(two, outcomes(passed[0])))])
    assert "| not run here (every case skipped) |" in table and "| **FAILS** |" in table


def test_a_patch_test_is_proven_only_when_pristine_fails_it_and_the_fork_passes_every_case():
    """The patch-tests tier's rule: a test that pristine passes proves nothing, a fork failure or a file that
    did not run on the fork is no proof either; the table tallies what each side did."""
    from upstream_suite.patch_tests import PatchTest, as_markdown, verdicts
    test = PatchTest("9009-Fix", "unit/test_fix.py", "")

    def side(*outcomes):
        return {f"unit/test_fix.py::t{i}": {"outcome": o, "unit": "unit/test_fix.py"} for i, o in enumerate(outcomes)}

    def proven(pristine, fork):
        return verdicts([test], fork, pristine)[0][3]

    assert proven(side("failed", "passed"), side("passed", "passed"))
    assert proven(side("error"), side("passed"))
    assert not proven(side("passed", "passed"), side("passed", "passed")), "pristine passes: proves nothing"
    assert not proven(side("failed"), side("passed", "failed"))
    assert not proven(side("failed"), {}), "not run on the fork"
    # A case that skips on both sides (it needs a device) is no evidence: the cases that ran decide.
    assert proven(side("failed", "skipped"), side("passed", "skipped"))
    assert not proven(side("failed", "skipped"), side("skipped", "skipped")), "nothing ran on the fork"
    assert not proven(side("failed", "passed"), side("passed", "skipped")), "the fork skips what pristine runs"
    assert not proven(side("skipped", "skipped"), side("passed", "skipped")), "pristine fails nothing"
    assert as_markdown(verdicts([test], side("passed", "skipped"), side("failed", "skipped"))).endswith(
        "| 1 failed, 1 skipped | 1 passed, 1 skipped | fails on pristine, passes on the fork (1 skipped on both) |")
    table = as_markdown(verdicts([test], side("passed", "passed", "passed"), side("failed", "failed", "passed")))
    # The patch by its name, which a reordered series keeps.
    assert table.splitlines()[-1] == ("| Fix | `tests/unit/test_fix.py` | 2 failed, 1 passed | 3 passed | "
                                      "fails on pristine, passes on the fork |")
