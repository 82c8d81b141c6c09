# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""MoE under tensor parallelism: the global grad norm and the update equal fp64 PyTorch.

tests/workers/moe_tp_norm.py trains one global batch of 8 through a top-1 MoE layer of 2 experts with an mpu in
Megatron's layout (tensor parallel 2; 2 ranks: data parallel 1, 4 ranks: data parallel 2), at every micro-batch x GAS
split, in the three layouts DeepSpeed builds: expert parallel 2 or 1 without expert tensor parallelism (each
tensor-parallel rank runs the experts on its own share of the tokens), and expert parallel 1 with it (the ranks compute
the same expert gradients); the output layer is row-parallel; a fourth layout, expert tensor parallelism with
Megatron's parallel MLP as the expert (split over the tensor-parallel ranks but for its last bias), establishes that
path (right on the fork; 0.19.8 fails it only where it fails the others: no norm on ZeRO-0, fp16's update). Regression
tests for deepspeed 0.19.8 and for the fork before patch Count-each-tensor-parallel-rank-s-experts-in-the-MoE: every
norm counted the experts as tensor-parallel replicas, leaving out what the tensor-parallel ranks other than 0 computed
(norm 3.1% low on 2 ranks, the clipped update as far off), and ZeRO-1/2 took 5 collectives for it; and before patch
Count-each-gradient-once-in-BF16_Optimizer-s-MoE-nor: BF16_Optimizer counted the experts once per tensor-parallel rank
under expert tensor parallelism, where they are replicas (norm 7.3% high, the update 12% off), and took 2 collectives
without it.
"""

import pytest

from helpers.rank_results import assert_collectives, assert_norm_matches, assert_update_matches, tolerance
from helpers.repo import REPO
from helpers.split_cases import case_name, launches, results
from test_moe_norm import NORM_TOLERANCE, UPDATE_TOLERANCE

WORKER = REPO / "tests" / "workers" / "moe_tp_norm.py"
SPLITS = {2: [(8, 1), (4, 2), (2, 4)], 4: [(4, 1), (2, 2)]}
LAYOUTS = ["ep2", "ep1", "ep1_expert_tp", "ep1_expert_tp_split"]
PATHS = ["zero0_fp32", "zero0_fp16", "zero1_fp32", "zero2_fp32", "zero1_bf16_fp32_accumulation", "zero2_bf16"]
ALL_CASES = [(ranks, layout, path, micro, gas) for ranks, splits in SPLITS.items() for layout in LAYOUTS
             for path in PATHS for micro, gas in splits]


def fast(ranks, layout, path, micro, gas):
    """CI: the layout where the experts of every tensor-parallel rank differ (the one 0.19.8 gets wrong on every path),
    without ZeRO and on ZeRO-2, and BF16_Optimizer under expert tensor parallelism (the one 0.19.8 and the fork before
    patch Count-each-gradient-once-in-BF16_Optimizer-s-MoE-nor get wrong), at GAS 2 on 2 ranks (CI's 30 minutes); the
    rest with
    --run-slow."""
    chosen = {("ep2", "zero0_fp32"), ("ep2", "zero2_fp32"), ("ep1_expert_tp", "zero1_bf16_fp32_accumulation")}
    return ranks == 2 and (layout, path) in chosen and gas == 2


CASES = [case if fast(*case) else pytest.param(case, marks=pytest.mark.slow) for case in ALL_CASES]


def ids(case):
    ranks, *rest = case
    return f"{ranks}ranks-{case_name(*rest)}"


@pytest.fixture(scope="module")
def launched(extensions_dir, request):
    return launches(WORKER, request, extensions_dir)


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_norm_matches_fp64_reference(launched, case):
    assert_norm_matches(results(launched, case), tolerance(NORM_TOLERANCE, case[2]))


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_update_matches_fp64_reference(launched, case):
    """SGD with clipping at 1.0 (the fp64 norm is 1.55, so it clips): a wrong norm is a wrong update, on
    the experts and the dense weights alike."""
    assert_update_matches(results(launched, case), tolerance(UPDATE_TOLERANCE, case[2]))


@pytest.mark.fork_only
@pytest.mark.parametrize("case", CASES, ids=ids)
def test_one_collective_per_step(launched, case):
    """The norm and the overflow flag in one collective (0.19.8: 2 without ZeRO, where it reports no norm;
    3 in fp16; 5 on ZeRO-1/2)."""
    assert_collectives(results(launched, case))
