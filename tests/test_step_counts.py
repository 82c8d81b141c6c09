# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""What a step costs the host, pinned: the fork's ATen ops, host reads, collectives and backward-hook calls per
micro-step may not grow past what was recorded (benchmarks/step_counts.py; the record holds pristine 0.19.8's
beside the fork's, and the fork's non-boundary micro-step costs no more than pristine's). A change that adds work
to every micro-step fails here, on a CPU, instead of on the next GPU run."""

import json
import os
import subprocess
import sys

import pytest
import torch

from helpers.repo import REPO

BENCHMARK = REPO / "benchmarks" / "step_counts.py"
RECORD = REPO / "docs" / "evidence" / "performance" / "step_counts-cpu-torch2.13.0.json"
PINNED = ["z1_bf16", "z2_bf16", "z3_bf16", "moe_z2_bf16"]
KINDS = ("aten", "host_reads", "collectives", "hooks")
# Work the fork does between boundaries and 0.19.8 leaves out, on purpose: (config, kind) -> (how much, why).
ADDED_ON_PURPOSE = {
    ("z0_fp16", "aten"): (2, "fp16 without ZeRO: the loss scaling 0.19.8 never applies (patch "
                          "Scale-the-loss-for-the-fp16-optimizers-of-ZeRO-stage), two multiplications"),
}


def pristine_budget(name, kind, pristine):
    """Pristine's non-boundary count of ``kind`` on ``name``, plus what the fork adds there on purpose."""
    return pristine["non_boundary"][kind] + ADDED_ON_PURPOSE.get((name, kind), (0, ""))[0]


def over_budget(counted, recorded):
    """Each count of ``counted`` above the recorded fork's (which no non-boundary count of pristine's is below)."""
    found = []
    for key, ours in counted["configs"].items():
        name = key.split("+")[0]
        fork, pristine = recorded["fork"]["configs"][name], recorded["pristine"]["configs"][name]
        for part in ("non_boundary", "boundary"):
            if fork[part] is None:  # a pipeline's step is counted whole, as its boundary
                continue
            for kind in KINDS:
                budget = fork[part][kind]
                if part == "non_boundary":
                    budget = min(budget, pristine_budget(name, kind, pristine))
                if ours[part][kind] > budget:
                    found.append(f"{key}: {ours[part][kind]:g} {kind} per {part} micro-step, recorded {budget:g}")
    return found


def test_the_record_has_the_fork_no_costlier_than_pristine_between_boundaries():
    recorded = json.loads(RECORD.read_text())
    for name, fork in recorded["fork"]["configs"].items():
        pristine = recorded["pristine"]["configs"][name]
        if fork["non_boundary"] is None:  # a pipeline's step is counted whole
            continue
        for kind in KINDS:
            assert fork["non_boundary"][kind] <= pristine_budget(name, kind, pristine), (name, kind)
    for (name, kind), (added, why) in ADDED_ON_PURPOSE.items():  # each still needed, and no more than it says
        fork, pristine = (recorded[side]["configs"][name]["non_boundary"][kind] for side in ("fork", "pristine"))
        assert fork - pristine == added, (name, kind, why)


@pytest.mark.fork_only
def test_the_fork_does_no_more_per_micro_step_than_recorded(tmp_path, extensions_dir):
    recorded = json.loads(RECORD.read_text())
    if torch.__version__ != recorded["fork"]["torch"]:
        pytest.skip(f"counts recorded on torch {recorded['fork']['torch']}; this is {torch.__version__}")
    out = tmp_path / "counts.json"
    env = dict(os.environ,
               RANK="0",
               LOCAL_RANK="0",
               WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1",
               TORCH_EXTENSIONS_DIR=str(extensions_dir),
               OMP_NUM_THREADS="1")
    from toolkit.ports import free_port
    env["MASTER_PORT"] = str(free_port())
    proc = subprocess.run([
        sys.executable,
        str(BENCHMARK), "--worker", "--out",
        str(out), "--configs", *PINNED, "--seed-extra-op", "z2_bf16"
    ],
                          capture_output=True,
                          text=True,
                          env=env,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counted = json.loads(out.read_text())
    real = {"configs": {name: counted["configs"][name] for name in PINNED}}
    seeded = {"configs": {"z2_bf16+extra_op": counted["configs"]["z2_bf16+extra_op"]}}
    assert over_budget(real, recorded) == []
    # The control: one extra op on every micro-step is caught.
    assert any("aten per non_boundary" in line for line in over_budget(seeded, recorded)), seeded
