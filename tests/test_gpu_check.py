# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""tools/gpu-check: its dry run (no GPU) finds every script and option it would use, so the command cannot rot
between GPU runs; each check's criterion fails on numbers that miss it."""

import argparse
import json
import subprocess
import sys

import pytest

from helpers.repo import REPO, load_script

TOOL = REPO / "tools" / "gpu-check"


@pytest.fixture(scope="module")
def gpu_check():
    import gpu_check
    return gpu_check


def test_dry_run_finds_every_command():
    proc = subprocess.run([sys.executable, str(TOOL), "--dry-run"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "dry run of 15 check(s): OK" in proc.stdout
    for name in ("fused-norm", "cuda-engines", "quantizer-wire-format", "gas-check-bf16-fused-adam",
                 "gas-check-superoffload", "gas-check-deepcompile-zero1", "gas-check-deepcompile-zero3",
                 "norm-bandwidth", "norm-host-time", "step-time-gpt2-125m", "step-time-llama-1b", "step-counts",
                 "upstream-gpu-tier"):
        assert f"{name}: " in proc.stdout


def test_dry_run_reports_an_option_a_script_lacks(gpu_check, capsys):
    check = gpu_check.Check("renamed-option",
                            "a benchmark whose option was renamed",
                            "-", ["{fork}"],
                            options={"benchmarks/grad_norm_speed.py": ["--device", "--no-such-option"]})
    args = argparse.Namespace(fork_python=sys.executable)
    assert gpu_check.dry_run([check], args) == 1
    assert "--no-such-option" in capsys.readouterr().err


def junit(tmp_path, cases):
    body = "".join(
        f'<testcase name="{name}">{"<skipped/>" if kind == "skipped" else "<failure/>" if kind == "failed" else ""}'
        "</testcase>" for name, kind in cases.items())
    (tmp_path / "r.xml").write_text(f'<testsuites><testsuite name="t">{body}</testsuite></testsuites>')


def test_pytest_criterion(gpu_check, tmp_path):
    judge = gpu_check.judge_pytest("r.xml", "cuda")
    junit(tmp_path, {"test_cuda_a": "passed", "test_cpu_b": "skipped"})
    assert judge(0, tmp_path)[0]
    junit(tmp_path, {"test_cuda_a": "skipped", "test_cpu_b": "passed"})  # a GPU test skipped: not a GPU check
    assert not judge(0, tmp_path)[0]
    junit(tmp_path, {"test_cuda_a": "passed", "test_cpu_b": "failed"})
    passed, detail = judge(1, tmp_path)
    assert not passed and "test_cpu_b" in detail
    assert not judge(0, tmp_path / "absent")[0]


def bandwidth_rows(fused_seconds):
    return {
        "rows": [{
            "model": "m",
            "dtype": "float32",
            "bytes": 1e9,
            "copy": {
                "seconds": 2.0
            },
            "fused op": {
                "seconds": fused_seconds,
                "rel_error": 1e-9
            }
        }]
    }


def test_bandwidth_criterion(gpu_check, tmp_path):
    # copy moves 2 GB in 2 s (1 GB/s); the norm reads 1 GB.
    (tmp_path / "norm-bandwidth.json").write_text(json.dumps(bandwidth_rows(1.05)))
    assert gpu_check.judge_norm_bandwidth(0, tmp_path)[0]
    (tmp_path / "norm-bandwidth.json").write_text(json.dumps(bandwidth_rows(1.25)))  # 80% of a copy
    assert not gpu_check.judge_norm_bandwidth(0, tmp_path)[0]


def test_step_time_and_host_time_criteria(gpu_check, tmp_path):
    (tmp_path / "step-time.json").write_text(
        json.dumps({"rows": [{
            "config": "a",
            "ratio": 0.6
        }, {
            "config": "b",
            "ratio": 1.2
        }]}))
    judge = gpu_check.judge_step_time("step-time.json")
    passed, detail = judge(0, tmp_path)
    assert not passed and "b 1.200" in detail
    (tmp_path / "step-time.json").write_text(json.dumps({"rows": [{"config": "a", "ratio": 0.6}]}))
    assert judge(0, tmp_path)[0]
    assert not judge(1, tmp_path)[0]
    # Within the spread: a round at or under 1.00 passes; slower in every round does not; a config left out fails.
    row = {"config": "a", "ratio": 1.04, "ratio_spread": [0.99, 1.1]}
    (tmp_path / "step-time.json").write_text(json.dumps({"rows": [row]}))
    assert judge(0, tmp_path)[0]
    (tmp_path / "step-time.json").write_text(json.dumps({"rows": [dict(row, ratio_spread=[1.01, 1.1])]}))
    passed, detail = judge(0, tmp_path)
    assert not passed and "slower than pristine in every round: a" in detail
    (tmp_path / "step-time.json").write_text(json.dumps({"rows": [row], "configs_left": ["b"]}))
    passed, detail = judge(0, tmp_path)
    assert not passed and "not run: b" in detail
    rows = [{"host_us": 200.0}, {"host_us": 60.0}, {"host_us": 100.0}, {"host_us": 120.0}]
    (tmp_path / "norm-host-time.json").write_text(json.dumps(rows))
    assert not gpu_check.judge_host_time(0, tmp_path)[0]
    (tmp_path / "norm-host-time.json").write_text(json.dumps(rows[:2]))
    assert gpu_check.judge_host_time(0, tmp_path)[0]


def test_step_time_worker_needs_no_pristine(monkeypatch):
    # The launcher starts the worker on the device machine, where pristine may not be found (or built) at all.
    step_time = load_script("benchmarks/step_time.py")
    ran = []
    monkeypatch.setattr(step_time, "pristine_python", lambda *sides: pytest.fail("the worker looked for pristine"))
    monkeypatch.setattr(step_time, "serve", lambda args: ran.append(args.serve))
    monkeypatch.setattr(sys, "argv", ["step_time.py", "--serve", "work/fork", "--parent-pid", "1"])
    step_time.main()
    assert ran == ["work/fork"]


def counts(aten, launches=None):
    part = {"aten": aten, "host_reads": 1, "collectives": 1}
    config = {"non_boundary": part, "boundary": part}
    if launches is not None:
        config["device"] = {"non_boundary": {"launches": launches, "device_ms": 0.1}, "boundary": None}
    return {"configs": {"z2_bf16": config}}


def test_step_counts_criterion(gpu_check, tmp_path):
    path = tmp_path / "step-counts.json"
    path.write_text(json.dumps({"fork": counts(100, 40), "pristine": counts(100, 40)}))
    assert gpu_check.judge_step_counts(0, tmp_path) == (True, "1 configs, 1 with device counts; none costlier")
    path.write_text(json.dumps({"fork": counts(100, 41), "pristine": counts(100, 40)}))
    passed, detail = gpu_check.judge_step_counts(0, tmp_path)
    assert not passed and "z2_bf16 launches 41 > 40" in detail
    path.write_text(json.dumps({"fork": counts(101), "pristine": counts(100)}))
    assert not gpu_check.judge_step_counts(0, tmp_path)[0]
    # A pipeline's step is counted whole: no non-boundary count to compare.
    whole = {"configs": {"pipe": {"non_boundary": None, "boundary": {"aten": 9}}}}
    path.write_text(json.dumps({"fork": whole, "pristine": whole}))
    assert gpu_check.judge_step_counts(0, tmp_path)[0]
    assert not gpu_check.judge_step_counts(1, tmp_path)[0]
