# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Ulysses sequence parallelism: the global grad norm and the update equal fp64 PyTorch on the whole
batch, on every ZeRO stage, for both ways of writing the loss.

tests/workers/sp_norm.py passes ``parallel_state_sp`` as the engine's mpu (sequence parallel 2) on 2
ranks (data parallel 1) and 4 (data parallel 2), ZeRO 0/1/2/3 (3 with and without reduce_scatter),
micro-batch x GAS at 2 splits. Each SP rank backpropagates either its share of the loss or the loss
gathered over the SP ranks (ALST's recipe: the tutorial, the HF Trainer, accelerate), declared to the
engine with ``set_sequence_parallel_loss``. On 0.19.8 the share is half the norm under ZeRO-3's
reduce-scatter and the gathered loss twice the norm on every other path (its clipped update hides it).
That mpu answers ``get_model_parallel_rank/group`` with the sequence-parallel rank and group, so every
norm takes SP ranks for tensor-parallel replicas: right, because after the engine's reduction every SP
rank holds the same gradient (or, under ZeRO, partitions over the sequence-data-parallel ranks).
"""

import pytest

from toolkit.launch import LaunchesByRanks
from helpers.rank_results import assert_collectives, assert_norm_matches, assert_update_matches
from helpers.repo import REPO
from helpers.selection import cases_by_ranks

WORKER = REPO / "tests" / "workers" / "sp_norm.py"
SPLITS = {2: [(8, 1), (4, 2)], 4: [(4, 1), (2, 2)]}
PATHS = ["zero0_fp32", "zero1_fp32", "zero2_fp32", "zero3_fp32", "zero3_allreduce_fp32"]
LOSSES = ["", "_alst"]  # each SP rank's share of the loss; the loss gathered over the SP ranks
CASES = [(ranks, f"{path}{loss}_sp2_m{m}_g{g}") for ranks in SPLITS for path in PATHS for loss in LOSSES
         for m, g in SPLITS[ranks]]
# loss_normalization "per_item" (patch Add-per-item-loss-normalization-to-ZeRO-0-BF16_Optim): samples of 0-3 items,
# each rank passes its chunk's loss sum and count; every SP and DP rank's items are distinct, so the counts simply add
# up.
PER_ITEM_CASES = [(ranks, f"{path}_per_item_sp2_m{m}_g{g}") for ranks in SPLITS for path in PATHS
                  for m, g in SPLITS[ranks]]


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
@pytest.mark.parametrize("case", PER_ITEM_CASES, ids=lambda case: f"{case[0]}ranks-{case[1]}")
def test_per_item_matches_the_fp64_item_mean(launched, case):
    ranks, name = case
    results = launched[ranks].case(name)
    assert_norm_matches(results, 1e-6)
    assert_update_matches(results, 2e-6)


@pytest.mark.fork_only  # the declaration and per-item mode are the fork's
@pytest.mark.parametrize("case", [(2, "refuses_per_item_with_a_gathered_loss")], ids=["2ranks"])
def test_per_item_is_refused_with_a_gathered_loss(launched, case):
    for message in launched[2].case(case[1]):
        assert message is not None, "deepspeed.initialize accepted per_item with a gathered SP loss"
        assert "loss_normalization" in message and "gathered" in message, message
