# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Two CPU ranks, started by the installed ``deepspeed`` launcher as users start them, train the same global batch at
two GAS splits on several engine paths (one launch)."""

import math

import pytest

from toolkit.launch import deepspeed_command, launch_cases
from helpers.repo import REPO

WORKER = REPO / "tests" / "workers" / "gas_splits.py"
CASES = ["zero0_fp32", "zero1_fp32", "zero2_fp32", "zero3_fp32", "zero1_bf16"]
NORM_TOLERANCE = {"fp32": 1e-5, "bf16": 3e-2}


@pytest.fixture(scope="module")
def launched(extensions_dir):
    return launch_cases(WORKER,
                        nprocs=2,
                        cases=CASES,
                        extensions_dir=extensions_dir,
                        timeout=900,
                        launcher=deepspeed_command())


def test_launch_exits_cleanly(launched):
    assert launched.returncode == 0, launched.tail()


@pytest.mark.parametrize("case", CASES)
def test_splits_match_fp64_reference(launched, case):
    rank0, rank1 = launched.case(case)
    assert rank0 == rank1, "ranks disagree about the same training run"
    assert rank0["agree"], f"weights off the fp64 reference by {rank0['max_weight_error']:.3e}"
    tolerance = NORM_TOLERANCE[case.rsplit("_", 1)[1]]
    for history in rank0["histories"]:
        for (loss, norm), (ref_loss, ref_norm) in zip(history, rank0["reference"]):
            assert math.isclose(loss, ref_loss, rel_tol=tolerance)
            # Upstream reports no norm for fp32 ZeRO-0 (get_global_grad_norm() is None): tracked in issue 3.
            if norm is not None:
                assert math.isclose(norm, ref_norm, rel_tol=tolerance), (norm, ref_norm)
