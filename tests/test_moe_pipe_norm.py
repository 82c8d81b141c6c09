# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""MoE under pipeline parallelism: the global grad norm and the update equal fp64 PyTorch.

tests/workers/moe_pipe_norm.py trains one global batch of 8 through a 2-stage PipelineModule with an MoE
block (top-1, 2 experts) on each stage: 2 ranks (expert parallel 1), 4 ranks (data parallel 2, expert
parallel 2), at every micro-batch x GAS split, without ZeRO (fp32, FP16_UnfusedOptimizer and bf16's
BF16_Optimizer) and on ZeRO-1; collectives of the model step counted. All --run-slow (CI's 30 minutes): docs/evidence/grad_norm.md has the fork
and 0.19.8 side by side.
"""

import pytest

from toolkit.launch import LaunchesByRanks
from helpers.rank_results import assert_collectives, assert_norm_matches, assert_update_matches, tolerance
from helpers.repo import REPO
from test_moe_norm import NORM_TOLERANCE, UPDATE_TOLERANCE

pytestmark = pytest.mark.slow

WORKER = REPO / "tests" / "workers" / "moe_pipe_norm.py"
SPLITS = {2: [(8, 1), (4, 2), (2, 4)], 4: [(4, 1), (2, 2)]}
PATHS = ["zero0_fp32", "zero1_fp32", "zero0_fp16", "zero0_bf16"]
CASES = [(ranks, path, micro, gas) for ranks, splits in SPLITS.items() for path in PATHS for micro, gas in splits]


def case_name(path, micro, gas):
    return f"{path}_m{micro}_g{gas}"


def ids(case):
    ranks, *rest = case
    return f"{ranks}ranks-{case_name(*rest)}"


@pytest.fixture(scope="module")
def launched(extensions_dir):
    return LaunchesByRanks(WORKER,
                           lambda ranks: [case_name(path, *split) for path in PATHS for split in SPLITS[ranks]],
                           extensions_dir)


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_norm_matches_fp64_reference(launched, case):
    ranks, path, micro, gas = case
    assert_norm_matches(launched[ranks].case(case_name(path, micro, gas)), tolerance(NORM_TOLERANCE, path))


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_update_matches_fp64_reference(launched, case):
    """SGD with clipping at 1.0 (the fp64 norm is 2.33, so it clips): a wrong norm is a wrong update."""
    ranks, path, micro, gas = case
    assert_update_matches(launched[ranks].case(case_name(path, micro, gas)), tolerance(UPDATE_TOLERANCE, path))


@pytest.mark.fork_only
@pytest.mark.parametrize("case", CASES, ids=ids)
def test_one_collective_per_step(launched, case):
    """The model step (inside train_batch()) takes the norm, every expert and stage counted once, and the
    overflow flag in one collective (0.19.8: 2 without ZeRO, bf16 included, 3 in fp16, 5 on ZeRO-1)."""
    ranks, path, micro, gas = case
    assert_collectives(launched[ranks].case(case_name(path, micro, gas)))
