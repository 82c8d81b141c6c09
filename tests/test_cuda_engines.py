# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""ds_gas_check's engine paths on one CUDA device (skipped without one).

On the CPU every tensor lives on one device, so the CPU suite cannot see a tensor on the wrong one:
with optimizer offload the fp32 gradients stay on the host while the norm's collective runs on the
accelerator. Each case trains micro-batch x GAS = 16x1 .. 2x8 on one rank and compares the reported
norm and the fp32 update with an fp64 PyTorch run, as tests/test_gas_check.py does on 2 CPU ranks.
"""

import pytest
import torch

from helpers.gas_results import assert_single_rank_splits_pass
from toolkit.launch import launch_cases
from helpers.repo import REPO

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

WORKER = REPO / "tests" / "workers" / "gas_checker.py"
CASES = [
    "zero0_fp32", "zero0_bf16", "zero0_fp16_static", "zero0_fp16_fused_adam_clip", "zero1_bf16",
    "zero1_bf16_fp32_accum_immediate", "zero2_bf16_clip", "zero2_fp16_dynamic", "zero2_fp32_adamw_clip", "zero3_fp32",
    "zero3_bf16_boundary_loop", "zero3_fp16_scale_growth", "zero1_offload_fp32_clip", "zero2_offload_bf16_clip",
    "zero3_offload_fp32", "zero3_offload_bf16_clip"
]


@pytest.fixture(scope="module")
def launched(extensions_dir):
    return launch_cases(WORKER, nprocs=1, cases=CASES, extensions_dir=extensions_dir, timeout=900)


@pytest.mark.parametrize("case", CASES)
def test_gas_invariant_on_cuda(launched, case):
    (rows, ) = launched.case(case)
    assert_single_rank_splits_pass(rows)
