# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Ulysses sequence parallelism: the global grad norm and the update equal fp64 PyTorch on the whole
batch (issue #11, item 4).

tests/workers/sp_norm.py passes ``parallel_state_sp`` as the engine's mpu (sequence parallel 2) on 2
ranks (data parallel 1) and 4 (data parallel 2), ZeRO 0/1/2, micro-batch x GAS at 2 splits. That mpu
answers ``get_model_parallel_rank/group`` with the sequence-parallel rank and group, so every norm
takes SP ranks for tensor-parallel replicas: right, because after the engine's reduction every SP
rank holds the same summed gradient (or, under ZeRO, partitions over the sequence-data-parallel
ranks). Measured equal on the fork and on 0.19.8 (which reports no norm without ZeRO).
"""

import pytest

from helpers.launch import LaunchesByRanks
from helpers.rank_results import assert_collectives, assert_norm_matches, assert_update_matches
from helpers.repo import REPO
from helpers.selection import cases_by_ranks

WORKER = REPO / "tests" / "workers" / "sp_norm.py"
SPLITS = {2: [(8, 1), (4, 2)], 4: [(4, 1), (2, 2)]}
PATHS = ["zero0_fp32", "zero1_fp32", "zero2_fp32"]
ALL_CASES = [(ranks, f"{path}_sp2_m{m}_g{g}") for ranks in SPLITS for path in PATHS for m, g in SPLITS[ranks]]
# loss_normalization "per_item" (patch 0023): samples of 0-3 items, each rank passes its chunk's loss sum
# and count; every SP and DP rank's items are distinct, so the counts simply add up.
PER_ITEM_CASES = [(ranks, f"{path}_per_item_sp2_m{m}_g{g}") for ranks in SPLITS for path in PATHS
                  for m, g in SPLITS[ranks]]

# Slow, 2 ranks too (with --run-slow): they establish paths where nothing was wrong, and CI keeps to
# its 30 minutes.
CASES = [pytest.param(case, marks=pytest.mark.slow) for case in ALL_CASES]


@pytest.fixture(scope="module")
def launched(extensions_dir, request):
    return LaunchesByRanks(WORKER, cases_by_ranks(request, "launched", lambda name: name), extensions_dir)


@pytest.mark.parametrize("case", CASES, ids=lambda case: f"{case[0]}ranks-{case[1]}")
def test_norm_and_update_match_fp64_reference(launched, case):
    ranks, name = case
    results = launched[ranks].case(name)
    assert_norm_matches(results, 1e-6)
    assert_update_matches(results, 2e-6)


@pytest.mark.fork_only
@pytest.mark.parametrize("case", CASES, ids=lambda case: f"{case[0]}ranks-{case[1]}")
def test_one_collective_per_step(launched, case):
    ranks, name = case
    assert_collectives(launched[ranks].case(name))


@pytest.mark.fork_only  # pristine DeepSpeed has no loss_normalization
@pytest.mark.parametrize("case", [pytest.param(case, marks=pytest.mark.slow) for case in PER_ITEM_CASES],
                         ids=lambda case: f"{case[0]}ranks-{case[1]}")
def test_per_item_matches_the_fp64_item_mean(launched, case):
    ranks, name = case
    results = launched[ranks].case(name)
    assert_norm_matches(results, 1e-6)
    assert_update_matches(results, 2e-6)
