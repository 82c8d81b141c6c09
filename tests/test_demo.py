# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""README's examples on two CPU ranks: gas_demo.py prints the comparison and agrees; per_item_loss.py ends with its
verdict in each mode."""

import pytest

from toolkit.launch import deepspeed_command, run_launcher
from helpers.repo import REPO


def test_gas_demo_two_ranks(extensions_dir):
    run = run_launcher(REPO / "examples" / "gas_demo.py",
                       nprocs=2,
                       extensions_dir=extensions_dir,
                       launcher=deepspeed_command())
    assert run.returncode == 0, run.log[-4000:]
    assert "norm 8x1 |     norm 2x4 |    norm fp64" in run.log
    assert ": AGREE" in run.log


@pytest.mark.parametrize("mode, verdict", [("per_item", ": AGREE"), ("mean", ": DIFFER (each micro-batch's own mean")])
def test_per_item_example_ends_with_its_verdict(extensions_dir, mode, verdict):
    """README's per-item example: per_item mode agrees with the fp64 global token mean at both splits; mean mode,
    DeepSpeed's default, is off by the split-dependent bias, and its last line says so."""
    run = run_launcher(REPO / "examples" / "per_item_loss.py",
                       nprocs=2,
                       args=["--mode", mode],
                       extensions_dir=extensions_dir,
                       launcher=deepspeed_command())
    assert run.returncode == 0, run.log[-4000:]
    last = [line for line in run.log.splitlines() if line.startswith(f"{mode} mode: largest update difference")]
    assert len(last) == 1 and verdict in last[0], run.log[-4000:]
