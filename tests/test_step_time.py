# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""benchmarks/step_time.py's run on the CPU: per config, both sides' workers answer every round, the table and its
JSON hold every config, and a worker whose parent is gone stops instead of waiting for ever. The figures are the
benchmark's; here both sides are this interpreter's deepspeed, so only the run itself is checked."""

import json
import subprocess
import sys

import pytest

from helpers.repo import REPO, load_script

BENCHMARK = REPO / "benchmarks" / "step_time.py"


@pytest.fixture(scope="module")
def step_time():
    return load_script("benchmarks/step_time.py")


def test_channel_waits_for_a_whole_reply_and_gives_up_when_its_writer_is_gone(step_time, tmp_path):
    channel = step_time.Channel(tmp_path)
    channel.write("reply", 1, {"step_s": 0.5})
    assert channel.read("reply", 1, alive=lambda: True) == {"step_s": 0.5}
    assert list(tmp_path.glob(".*")) == []  # written aside, then renamed: no partial file left
    assert channel.read("reply", 2, alive=lambda: False) is None
    assert channel.read("reply", 2, alive=lambda: True, timeout=0.05) is None


@pytest.mark.slow  # about 110 s on 2 cores, for CI's 30 minutes; tools/gpu-check runs the benchmark itself
def test_both_sides_answer_every_round(tmp_path, extensions_dir):
    out = tmp_path / "step_time.json"
    proc = subprocess.run([
        sys.executable,
        str(BENCHMARK), "--pristine-python", sys.executable, "--ranks", "1", "--model", "llama-tiny", "--configs",
        "z3_bf16_gas8", "--repeat", "2", "--steps", "1", "--warmup", "0", "--extensions-dir",
        str(extensions_dir), "--work-dir",
        str(tmp_path / "work"), "--json",
        str(out)
    ],
                          capture_output=True,
                          text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["configs_left"] == []
    assert [row["config"] for row in record["rows"]] == ["z3_bf16_gas8"]
    for row in record["rows"]:
        assert row["ratio_spread"][0] <= row["ratio"] <= row["ratio_spread"][1], row
        assert row["parameters"] > 0
    for results in record["rounds"]:
        for side in ("fork", "pristine"):
            assert results[side]["configs"]["z3_bf16_gas8"]["step_s"] > 0
    assert "| z3_bf16_gas8 |" in proc.stdout
