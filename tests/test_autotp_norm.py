# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""AutoTP training (``tensor_parallel.autotp_size`` 2): the global grad norm and the update equal fp64
PyTorch on the unsplit model (issue #11, item 5).

tests/workers/autotp_norm.py splits an MLP as AutoTP splits a transformer's (a column-parallel linear,
a row-parallel one with a replicated bias, a replicated last linear) on 2 ranks (TP 2) and 4 ranks
(TP 2 x DP 2), ZeRO 0/1/2, micro-batch x GAS at 2 splits: split parameters count per shard,
replicated ones once. Measured equal on the fork and on 0.19.8 (which reports no norm without ZeRO).
The same with the TP block under activation checkpointing configured from the config (its input partitioned over
the TP ranks, on the CPU, or in contiguous buffers).
"""

import pytest

from toolkit.launch import LaunchesByRanks
from helpers.rank_results import assert_collectives, assert_norm_matches, assert_update_matches
from helpers.repo import REPO
from helpers.selection import cases_by_ranks

WORKER = REPO / "tests" / "workers" / "autotp_norm.py"
SPLITS = {2: [(8, 1), (4, 2)], 4: [(4, 1), (2, 2)]}
PATHS = ["zero0_fp32", "zero1_fp32", "zero2_fp32"]
ALL_CASES = [(ranks, f"{path}_m{m}_g{g}") for ranks in SPLITS for path in PATHS for m, g in SPLITS[ranks]]
# loss_normalization "per_item" (patch Add-per-item-loss-normalization-to-ZeRO-0-BF16_Optim): samples of 0-3 items,
# against the fp64 item mean of the unsplit model. The ZeRO-1/2 norm's collective sums the counts over the TP ranks
# too, which count the same micro-batch: each adds its 1/TP share.
PER_ITEM_CASES = [(ranks, f"{path}_per_item_m{m}_g{g}") for ranks in SPLITS for path in PATHS
                  for m, g in SPLITS[ranks]]

# Activation checkpointing of the TP block from the config (deepspeed.checkpointing.configure with the TP group):
# partitioned activations, their CPU copies, contiguous buffers.
CHECKPOINTING = ["_ckpt_partitioned", "_ckpt_partitioned_cpu", "_ckpt_partitioned_contiguous"]
CHECKPOINTED_CASES = [(ranks, f"{path}{c}_m{m}_g{g}") for ranks in SPLITS for path in PATHS for c in CHECKPOINTING
                      for m, g in SPLITS[ranks]]
ALL_CASES += CHECKPOINTED_CASES
# tensor_parallel.tp_overlap_comm: the column-parallel input gradient all-reduced as the weight gradient is computed.
ALL_CASES += [(ranks, f"{path}_tp_overlap_m{m}_g{g}") for ranks in SPLITS for path in PATHS for m, g in SPLITS[ranks]]

# Slow, 2 ranks too (with --run-slow): they establish paths where nothing was wrong, and CI keeps to
# its 30 minutes.
CASES = [pytest.param(case, marks=pytest.mark.slow) for case in ALL_CASES]


@pytest.fixture(scope="module")
def launched(extensions_dir, request):
    return LaunchesByRanks(WORKER, cases_by_ranks(request, "launched", lambda name: name), extensions_dir)


def ids(case):
    return f"{case[0]}ranks-{case[1]}"


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_norm_and_update_match_fp64_reference(launched, case):
    ranks, name = case
    results = launched[ranks].case(name)
    assert_norm_matches(results, 1e-6)
    assert_update_matches(results, 2e-6)


@pytest.mark.fork_only
@pytest.mark.parametrize("case", [pytest.param(case, marks=pytest.mark.slow) for case in CHECKPOINTED_CASES], ids=ids)
def test_checkpointing_configured_from_the_config(launched, case):
    """The checkpointed cases ran what their config asked: activations partitioned over the 2 TP ranks, on the CPU
    or in contiguous buffers."""
    ranks, name = case
    expected = {"partitioned": True, "cpu": "_cpu_m" in name, "contiguous": "_contiguous" in name, "mp_size": 2}
    for rank, result in enumerate(launched[ranks].case(name)):
        assert result["checkpointing"] == expected, f"rank {rank}: {result['checkpointing']}"


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_one_collective_per_step(launched, case):
    """0.19.8: 2 on every case here."""
    ranks, name = case
    assert_collectives(launched[ranks].case(name))


@pytest.mark.fork_only  # pristine DeepSpeed has no loss_normalization
@pytest.mark.parametrize("case", [pytest.param(case, marks=pytest.mark.slow) for case in PER_ITEM_CASES], ids=ids)
def test_per_item_matches_the_fp64_item_mean(launched, case):
    ranks, name = case
    results = launched[ranks].case(name)
    assert_norm_matches(results, 1e-6)
    assert_update_matches(results, 2e-6)
