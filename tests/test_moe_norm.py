# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""MoE: the global grad norm and the update equal fp64 PyTorch on every engine path and split.

tests/workers/moe_norm.py trains one global batch of 8 through a top-1 MoE layer (expert parallel 2)
on 2 ranks (every rank a different expert) and on 4 ranks (each expert with 2 data-parallel
replicas), at every micro-batch x GAS split of the rank's share. Regression tests for deepspeed
0.19.8 (upstream issues #8475 and #8613): without ZeRO, fp32 reports no norm and clips with each
rank's norm averaged over the data-parallel ranks; FP16_UnfusedOptimizer leaves the experts out of
its norm (and, before patch Scale-the-loss-for-the-fp16-optimizers-of-ZeRO-stage, never scaled the loss).
"""

import pytest

from toolkit.launch import LaunchesByRanks
from helpers.rank_results import assert_collectives, assert_norm_matches, assert_update_matches, tolerance
from helpers.repo import REPO
from helpers.selection import cases_by_ranks

WORKER = REPO / "tests" / "workers" / "moe_norm.py"
SPLITS = {2: [(4, 1), (2, 2), (1, 4)], 4: [(2, 1), (1, 2)]}
PATHS = [
    "zero0_fp32", "zero0_fp32_no_clipping", "zero0_fp16", "zero0_fp16_fused_adam", "zero1_bf16_fp32_accumulation",
    "zero1_fp32", "zero2_fp32", "zero2_fp16", "zero2_bf16", "zero2_fp32_data_before_expert"
]
# Norm: fp32 is the norm's own rounding; fp16/bf16 gradients come from 11/8-bit weights, and ZeRO-2 bf16
# accumulates them in bf16 (2.5e-3 seen at GAS 2). Update: against the fp64 update rounded to the
# weights' dtype, relative to the update's size; bf16 rounding flips alone reach 3.7%.
NORM_TOLERANCE = {"bf16": 5e-3, "fp16": 2e-3, "fp32": 1e-6}
UPDATE_TOLERANCE = {"bf16": 6e-2, "fp16": 1e-2, "fp32": 1e-6}
ALL_CASES = [(ranks, path, micro, gas) for ranks, splits in SPLITS.items() for path in PATHS for micro, gas in splits]


def fast(ranks, path):
    """CI runs the ZeRO-0 paths (patch Count-each-expert-once-in-the-ZeRO-0-global-grad-nor's) on 2 ranks; the rest,
    and 4 ranks, with --run-slow (CI keeps to its 30 minutes; tests/test_global_grad_norm.py runs MoE on ZeRO-1/2
    besides)."""
    return ranks == 2 and path.startswith("zero0")


def marked(cases):
    return [case if fast(*case[:2]) else pytest.param(case, marks=pytest.mark.slow) for case in cases]


CASES = marked(ALL_CASES)


def case_name(path, micro, gas):
    return f"{path}_m{micro}_g{gas}"


@pytest.fixture(scope="module")
def launched(extensions_dir, request):
    return LaunchesByRanks(WORKER, cases_by_ranks(request, "launched", case_name), extensions_dir)


def ids(case):
    ranks, path, micro, gas = case
    return f"{ranks}ranks-{case_name(path, micro, gas)}"


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_norm_matches_fp64_reference(launched, case):
    ranks, path, micro, gas = case
    assert_norm_matches(launched[ranks].case(case_name(path, micro, gas)), tolerance(NORM_TOLERANCE, path))


@pytest.mark.parametrize("case", marked([c for c in ALL_CASES if "adam" not in c[1]]), ids=ids)
def test_update_matches_fp64_reference(launched, case):
    """SGD with clipping at 1.0 (the fp64 norm is 1.55, so it clips): a wrong norm is a wrong update."""
    ranks, path, micro, gas = case
    assert_update_matches(launched[ranks].case(case_name(path, micro, gas)), tolerance(UPDATE_TOLERANCE, path))


@pytest.mark.fork_only
@pytest.mark.parametrize("case", CASES, ids=ids)
def test_one_collective_per_step(launched, case):
    """The norm, each expert counted once, and the overflow flag in one collective (0.19.8: 1 to 4, and
    none without clipping, where it reports no norm)."""
    ranks, path, micro, gas = case
    assert_collectives(launched[ranks].case(case_name(path, micro, gas)))


# loss_normalization "per_item" (patches Add-per-item-loss-normalization-to-ZeRO-stages-1-and and
# Add-per-item-loss-normalization-to-ZeRO-0-BF16_Optim): samples of 0-3 items, the mean over every item of the global
# batch. CI runs the ZeRO-0 (engine all-reduce) and ZeRO-2 (norm collective) paths on 2 ranks.
PER_ITEM_PATHS = [
    "zero0_fp32_per_item", "zero0_fp16_per_item", "zero1_bf16_fp32_accumulation_per_item", "zero1_fp32_per_item",
    "zero2_fp32_per_item", "zero2_bf16_per_item"
]
PER_ITEM_FAST = ["zero0_fp32_per_item", "zero2_fp32_per_item"]
PER_ITEM_CASES = [
    case if case[0] == 2 and case[1] in PER_ITEM_FAST else pytest.param(case, marks=pytest.mark.slow)
    for case in [(ranks, path, micro, gas) for ranks, splits in SPLITS.items() for path in PER_ITEM_PATHS
                 for micro, gas in splits]
]


@pytest.fixture(scope="module")
def launched_per_item(extensions_dir, request):
    return LaunchesByRanks(WORKER, cases_by_ranks(request, "launched_per_item", case_name), extensions_dir)


@pytest.mark.fork_only  # pristine DeepSpeed has no loss_normalization
@pytest.mark.parametrize("case", PER_ITEM_CASES, ids=ids)
def test_per_item_matches_the_fp64_item_mean(launched_per_item, case):
    """Expert gradients come back from the all-to-all with every rank's items in them: dividing the
    reduced sums by the global item count (in the norm's collective on ZeRO-1/2, in the engine's
    gradient all-reduce without ZeRO, experts' all-reduce included) gives the item mean's gradient."""
    ranks, path, micro, gas = case
    results = launched_per_item[ranks].case(case_name(path, micro, gas))
    assert_norm_matches(results, tolerance(NORM_TOLERANCE, path))
    assert_update_matches(results, tolerance(UPDATE_TOLERANCE, path))
