# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Our clients' own DeepSpeed tests (tools/client-tier): the fast part, on the fork and on pristine upstream.

transformers' Trainer at ZeRO-2 and ZeRO-3 (bf16 and fp16): its basic training and its gradient-accumulation
equivalence test; accelerate's test_deepspeed_gradient_accumulation.py (the accumulation boundary handed to
DeepSpeed, sync_gradients in backward, clip_grad_norm_ returning DeepSpeed's norm; fp16 with CPU offload): the
family of bugs this fork exists for. Each must pass on the fork, and none may pass on pristine and fail on the
fork. The whole tier runs before a release; its report is docs/evidence/client_tier/report.md.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from helpers.pristine import pristine_python
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
        str(REPO / "tools" / "client-tier"), "--selections", *SELECTIONS, "-k", FAST, "--pristine-python",
        pristine_python(), "--work-dir",
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
    # Pristine 0.19.8 fails every Trainer test here (patch 0031's bug), so "no regression" alone would pass a fork
    # that failed them too: on the fork each must pass.
    for name, least in zip(SELECTIONS, (8, 3)):
        summary = selections[name]
        for side, outcomes in summary["outcomes"].items():  # by name in the log (pytest -rA shows it)
            print("\n".join(f"{side}: {test_id}: {result['outcome']}" for test_id, result in sorted(outcomes.items())))
        assert summary["categories"]["regression"] == 0, summary["regressions"]
        fork = summary["sides"]["fork"]
        assert fork["run"] >= least and fork["passed"] == fork["run"], summary["outcomes"]["fork"]
