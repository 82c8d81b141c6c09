# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Curriculum data sampling: the engine's loader picks the same global batches however a batch is split, only samples
the schedule allows, and the training on them equals fp64 PyTorch's.

tests/workers/curriculum_sampling.py (2 ranks): a value-based difficulty metric written as the data analyzer's index
files, a fixed_discrete schedule (difficulty 1, 2, then 3), 3 steps of a global batch of 8 through
``deepspeed.initialize``'s ``training_data`` loader at micro-batch x GAS 4x1, 2x2, 1x4 per rank, ZeRO-1 and ZeRO-3.
0.19.8 gives the same results.
"""

import pytest

from helpers.rank_results import assert_norm_matches, assert_update_matches, each_rank
from helpers.repo import REPO
from helpers.split_cases import case_id, launches, results

WORKER = REPO / "tests" / "workers" / "curriculum_sampling.py"
RANKS = 2
PATHS = ["zero1_fp32", "zero3_fp32"]
SPLITS = [(4, 1), (2, 2), (1, 4)]
SCHEDULE = [1, 2, 3]  # the hardest difficulty the schedule allows at steps 1, 2, 3
CASES = [(RANKS, path, micro, gas) for path in PATHS for micro, gas in SPLITS]
# fp32: the norm's rounding; the update after 3 steps relative to the weights' change: fp32 rounding (1.5e-6 seen).
NORM_TOLERANCE, UPDATE_TOLERANCE = 1e-6, 2e-5


@pytest.fixture(scope="module")
def launched(extensions_dir, request):
    return launches(WORKER, request, extensions_dir)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_global_batches_do_not_depend_on_the_split(launched, case):
    """Every rank saw the same global batches (gathered), those of the split 4x1, 8 distinct samples each."""
    first = results(launched, (RANKS, case[1], *SPLITS[0]))
    for rank, result in each_rank(results(launched, case)):
        assert result["global_batches"] == first[0]["global_batches"], f"rank {rank}: {result['global_batches']}"
        assert all(len(set(batch)) == 8 for batch in result["global_batches"]), result["global_batches"]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_batches_follow_the_schedule(launched, case):
    for rank, result in each_rank(results(launched, case)):
        assert result["hardest"] == SCHEDULE, f"rank {rank}: hardest sample per step {result['hardest']}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_norm_matches_fp64_reference(launched, case):
    assert_norm_matches(results(launched, case), NORM_TOLERANCE)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_update_matches_fp64_reference(launched, case):
    """SGD clipped at 0.5 (the fp64 norm is 1.64), 3 steps on the batches the loader chose."""
    assert_update_matches(results(launched, case), UPDATE_TOLERANCE)
