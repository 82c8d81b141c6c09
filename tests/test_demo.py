# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""README's main job: examples/gas_demo.py on two CPU ranks prints the comparison and agrees."""

from helpers.launch import deepspeed_command, run_launcher
from helpers.repo import REPO


def test_gas_demo_two_ranks(extensions_dir):
    run = run_launcher(REPO / "examples" / "gas_demo.py",
                       nprocs=2,
                       extensions_dir=extensions_dir,
                       launcher=deepspeed_command())
    assert run.returncode == 0, run.log[-4000:]
    assert "norm 8x1 |     norm 2x4 |    norm fp64" in run.log
    assert ": AGREE" in run.log
