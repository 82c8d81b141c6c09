# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Our clients' own DeepSpeed tests (tools/client-tier): the fast part, on the fork and on pristine upstream.

transformers' Trainer at ZeRO-2 and ZeRO-3 (bf16 and fp16): its basic training and its gradient-accumulation
equivalence test; accelerate's test_deepspeed_gradient_accumulation.py (the accumulation boundary handed to
DeepSpeed, sync_gradients in backward, clip_grad_norm_ returning DeepSpeed's norm; fp16 with CPU offload): the
family of bugs this fork exists for. Each must pass on the fork, and none may pass on pristine and fail on the
fork. Pristine's side replays its outcomes recorded for the same packages and tests
(tools/client_tier/baselines/pristine.json), and runs where they differ. The whole tier runs before a release; its
report is docs/evidence/client_tier/report.md.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from helpers.repo import REPO

CLIENT_TESTS = REPO.parent / "shared" / "client-tests"
# pytest's -k is case-insensitive and matches file names: "gradient_accumulation" takes accelerate's whole file.
FAST = "basic_training or gradient_accumulation"
SELECTIONS = ("transformers-trainer", "accelerate")

pytestmark = pytest.mark.fork_only


def client_tests_or_skip():
    missing = [name for name in ("transformers", "accelerate") if importlib.util.find_spec(name) is None]
    if not CLIENT_TESTS.is_dir():
        missing.append(str(CLIENT_TESTS))
    if missing and os.environ.get("DS_GAFIX_REQUIRE_HF") == "1":
        pytest.fail(f"DS_GAFIX_REQUIRE_HF=1 but the client tier lacks {', '.join(missing)}")
    if missing:
        pytest.skip(f"the client tier needs {', '.join(missing)}")


def test_client_tier_fast_part_has_no_regression(tmp_path, extensions_dir):
    client_tests_or_skip()
    report = tmp_path / "report.md"
    proc = subprocess.run([
        sys.executable,
        str(REPO / "tools" / "client-tier"), "--selections", *SELECTIONS, "-k", FAST, "--pristine-baseline",
        "--or-run-pristine", "--work-dir",
        str(tmp_path / "work"), "--fork-extensions-dir",
        str(extensions_dir), "--report",
        str(report), "--timeout", "900"
    ],
                          stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT,
                          text=True)
    print(proc.stdout[-6000:])
    assert proc.returncode == 0, proc.stdout[-6000:]
    selections = json.loads(report.with_suffix(".json").read_text())["selections"]
    # Pristine 0.19.8 fails every Trainer test here (patch Broadcast-a-0-dim-parameter-as-its-one-element-view's bug),
    # so "no regression" alone would pass a fork that failed them too: on the fork each must pass.
    for name, least in zip(SELECTIONS, (8, 3)):
        summary = selections[name]
        for side, outcomes in summary["outcomes"].items():  # by name in the log (pytest -rA shows it)
            print("\n".join(f"{side}: {test_id}: {result['outcome']}" for test_id, result in sorted(outcomes.items())))
        assert summary["categories"]["regression"] == 0, summary["regressions"]
        fork = summary["sides"]["fork"]
        assert fork["run"] >= least and fork["passed"] == fork["run"], summary["outcomes"]["fork"]


def test_a_record_of_pristine_serves_only_the_setup_it_was_made_for(tmp_path):
    """A replayed record stands for pristine's run only where nothing its outcomes depend on differs: another
    transformers (or tests, -k, torch ...) or a selection it lacks is refused, naming what differs."""
    from client_tier import baseline
    from upstream_suite.baseline import BaselineError
    identity = {key: f"{key}-1" for key in baseline.KEYS}
    outcomes = {"accelerate/tests.deepspeed.test_x::test_y": {"outcome": "passed", "reason": ""}}
    path = tmp_path / "pristine.json"
    baseline.record(path, identity, {"accelerate": {"outcomes": outcomes, "seconds": 7}})
    assert baseline.load(path, identity, ["accelerate"]) == {"accelerate": {"outcomes": outcomes, "seconds": 7}}
    with pytest.raises(BaselineError, match="transformers: recorded 'transformers-1', now '4.99'"):
        baseline.load(path, dict(identity, transformers="4.99"), ["accelerate"])
    with pytest.raises(BaselineError, match="lacks selection.s. transformers-trainer"):
        baseline.load(path, identity, ["accelerate", "transformers-trainer"])
    with pytest.raises(BaselineError, match="no client-tier baseline"):
        baseline.load(tmp_path / "none.json", identity, ["accelerate"])


def test_a_record_is_keyed_by_each_package_s_own_version(tmp_path):
    """The record's keys take each version from its place in the probe: a shifted one would key transformers by
    pytest's version, and refuse (or worse, accept) a record for the wrong reason."""
    from client_tier import baseline, cli
    from toolkit import sides
    (tmp_path / "test_x.py").write_text("")
    probe = ["0.19.8+gafix.5", "2.13.0+cpu", "3.11", "8.3.5", "5.24.0", "1.15.0", "5.2.0"]  # probe_versions' order
    identity = cli.identity_of(probe, tmp_path, "gradient_accumulation")
    assert set(identity) == set(baseline.KEYS)
    assert (identity["torch"], identity["python"], identity["pytest"], identity["transformers"],
            identity["accelerate"], identity["datasets"]) == tuple(probe[1:])
    assert identity["keyword"] == "gradient_accumulation" and identity["pristine_version"] == sides.upstream_version()


def test_a_client_run_inside_a_pytest_run_does_not_take_its_options(tmp_path, monkeypatch):
    """CI exports PYTEST_ADDOPTS (``--junitxml=build/ci-junit.xml -rA --durations=30``): a client test run started
    from a test took them too, and kept its own JUnit XML off CI's path only because its ``--junitxml`` came later.
    Each side, client or upstream, starts without the outer run's pytest variables."""
    from client_tier import cli
    from upstream_suite.execute import Side, child_environ
    monkeypatch.setenv("PYTEST_ADDOPTS", "--junitxml=ci-junit.xml")
    monkeypatch.setenv("DS_GAFIX_REQUIRE_HF", "1")
    client = cli.side_env(sys.executable, tmp_path, "fork", tmp_path / "hf")
    upstream = child_environ(Side("fork", sys.executable, tmp_path / "ext", str(tmp_path)), tmp_path / "ev", 60, 8)
    for env in (client, upstream):
        assert "PYTEST_ADDOPTS" not in env and env["DS_GAFIX_REQUIRE_HF"] == "1"
