# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Random-LTD (``data_efficiency.data_routing``): layers see a random subset of each sequence's tokens, drawn per
micro-batch, so another split of the batch draws differently and trains differently by design. What it does promise,
at every split: the update is fp64's with each micro-batch's own draw, its losses averaged over the micro-steps and
ranks as without random-LTD, and the number of tokens kept follows the schedule by optimizer step.

tests/workers/random_ltd.py (2 ranks): three residual blocks, tokens dropped in two, the schedule keeping 4 of 8
tokens at step 0 and 6 at step 1; two SGD steps of a global batch of 8 sequences at micro-batch x GAS 4x1, 2x2, 1x4
per rank; ZeRO-1 and ZeRO-3 fp32, ZeRO-2 bf16. The op's token gather and scatter (CUDA only) run as torch index
operations. 0.19.8 gives the same results.
"""

import pytest

from helpers.rank_results import assert_update_matches, each_rank, tolerance
from helpers.repo import REPO
from helpers.split_cases import case_id, launches, results

WORKER = REPO / "tests" / "workers" / "random_ltd.py"
RANKS = 2
PATHS = ["zero1_fp32", "zero3_fp32", "zero2_bf16"]
SPLITS = [(4, 1), (2, 2), (1, 4)]
CASES = [(RANKS, path, micro, gas) for path in PATHS for micro, gas in SPLITS]
KEPT = [[4], [6]]  # tokens each dropping block saw per step, whatever the micro-step
# Relative to the step, two steps: fp32 rounding (5.5e-7 seen); bf16 activations and gradients (2.5e-2 seen). A
# reference blind to the draws is 0.24 off.
UPDATE_TOLERANCE = {"bf16": 5e-2, "fp32": 1e-5}
BLIND_REFERENCE = 0.15


@pytest.fixture(scope="module")
def launched(extensions_dir, request):
    return launches(WORKER, request, extensions_dir)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_tokens_kept_follow_the_schedule_by_step(launched, case):
    for rank, result in each_rank(results(launched, case)):
        assert result["kept_per_step"] == KEPT, f"rank {rank}: {result}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_update_is_fp64_with_each_micro_batch_draw(launched, case):
    assert_update_matches(results(launched, case), tolerance(UPDATE_TOLERANCE, case[1]))


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_the_draws_matter(launched, case):
    """The check can fail: against a reference that keeps every token the update is far off."""
    for rank, result in each_rank(results(launched, case)):
        assert result["update_error_to_every_token"] > BLIND_REFERENCE, f"rank {rank}: {result}"
