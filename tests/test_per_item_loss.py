# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""``"loss_normalization": "per_item"``: the update of the mean over every item of the global batch,
whatever the micro-batch x GAS x ranks split (tests/workers/per_item_loss.py; docs/guides/per_item_loss.md).

Samples hold 0-12 labelled positions of 12, so per-micro-batch means (mean mode) and the global item
mean differ by O(1): the guard cases assert that gap, so a per_item path that fell back to means fails.
CI runs 2 ranks; 1 and 4 ranks are --run-slow.
"""

import pytest

from toolkit.launch import LaunchesByRanks
from helpers.repo import REPO
from helpers.selection import selected_callspecs

pytestmark = pytest.mark.fork_only  # pristine DeepSpeed has no loss_normalization (it refuses num_items)

WORKER = REPO / "tests" / "workers" / "per_item_loss.py"
# Relative tolerances against fp64, by what the engine computes in (norm; update after steps 1 and 3).
NORM_TOLERANCE = {"fp32": 1e-6, "bf16": 5e-3, "fp16": 1e-3}
UPDATE_TOLERANCE = {"fp32": 1e-4, "bf16": 3e-2, "fp16": 3e-3}
PATHS = [
    "zero1_fp32", "zero2_fp32_clip", "zero1_fp32_allreduce_sum", "zero2_bf16_clip", "zero1_fp16_dynamic",
    "zero2_offload_fp32_clip", "zero3_fp32_clip", "zero3_bf16_clip", "zero3_fp16_dynamic", "zero3_offload_fp32_clip",
    "zero0_fp32", "zero0_fp32_clip", "zero0_fp32_allreduce_sum", "zero0_bf16_clip", "zero0_fp16_dynamic",
    "zero1_bf16_fp32_accumulation_clip"
]
# 2 stages x the other ranks as data-parallel; cases that make a pipeline's grid run last in a launch
# (deepspeed.utils.groups keeps it for the process's lifetime).
PIPELINE_PATHS = [
    "pipe2_zero1_fp32", "pipe2_zero1_fp32_clip", "pipe2_zero1_fp16_dynamic", "pipe2_fp32_clip", "pipe2_bf16_clip"
]
PIPELINE_MEAN_MODE = ["pipe2_zero1_fp32_mean_mode", "pipe2_fp32_clip_mean_mode"]
MEAN_MODE = [
    "zero1_fp32_mean_mode", "zero2_bf16_clip_mean_mode", "zero3_fp32_clip_mean_mode", "zero0_fp32_mean_mode",
    "zero0_bf16_clip_mean_mode", "zero1_bf16_fp32_accumulation_clip_mean_mode", "zero0_fp16_dynamic_mean_mode"
]
AT_EVERY_RANK_COUNT = [
    "zero1_fp32", "zero2_fp32_clip", "zero2_bf16_clip", "zero3_fp32_clip", "zero0_fp32_clip",
    "zero1_bf16_fp32_accumulation_clip"
]
COUNT_CASES = ["count_rides_in_the_bucket", "count_goes_alone_beyond_exact_digits"]
NO_ITEMS = ["no_items_anywhere", "no_items_anywhere_zero3", "no_items_anywhere_zero0", "no_items_anywhere_zero0_bf16"]
REFUSALS = {
    "refuses_bad_value": ("DeepSpeedConfigError", "Invalid loss_normalization: 'token'. Supported values: ['mean', "
                          "'per_item']"),
    "refuses_backward_without_num_items": ("ValueError", "call backward(loss, num_items=n)"),
    "refuses_num_items_in_mean_mode": ("ValueError", "needs \"loss_normalization\": \"per_item\""),
}
# Last in a launch: an engine with torch_autocast sets deepspeed.runtime.torch_autocast's process-wide
# state before the refusal, and later engines of the process then differ between ranks.
LAST_REFUSALS = {"refuses_zero0_torch_autocast_fp16": ("DeepSpeedConfigError", "a torch autocast GradScaler")}
PIPELINE_REFUSALS = {
    "refuses_pipeline_loss_fn_without_count":
    ("ValueError", "the PipelineModule's loss_fn must return (loss_sum, num_items), not Tensor"),
}


def dtype_of(path):
    return next((name for name in ("bf16", "fp16") if name in path), "fp32")


def cases_for(ranks):
    """Every case at ``ranks``, in launch order (a launch runs the ones its selected tests read, in this order)."""
    if ranks == 2:
        pipeline = PIPELINE_PATHS + PIPELINE_MEAN_MODE + list(PIPELINE_REFUSALS) + list(LAST_REFUSALS)
        return PATHS + MEAN_MODE + NO_ITEMS + COUNT_CASES + list(REFUSALS) + pipeline
    wide = AT_EVERY_RANK_COUNT + ["zero1_fp32_mean_mode"]
    return wide if ranks == 1 else wide + ["pipe2_zero1_fp32_clip", "pipe2_fp32_clip", "pipe2_zero1_fp32_mean_mode"]


def cases_read_by(params):
    """(ranks, case) pairs a test with these parameters reads: ``ranks, path``; a ``path`` on 2 ranks with its
    mean-mode twin; or a ``case`` on 2 ranks."""
    if "ranks" in params:
        return [(params["ranks"], params["path"])]
    if "path" in params:
        return [(2, params["path"]), (2, f"{params['path']}_mean_mode")]
    return [(2, params["case"])]


@pytest.fixture(scope="module")
def launched(extensions_dir, request):
    # The cases of the tests this run selected (-k narrows a launch; 1 and 4 ranks run with --run-slow only).
    read = {pair for params in selected_callspecs(request, "launched") for pair in cases_read_by(params)}
    return LaunchesByRanks(WORKER, lambda ranks: [case for case in cases_for(ranks) if (ranks, case) in read],
                           extensions_dir)


def rank_params(paths):
    return [
        pytest.param(ranks, path, marks=[] if ranks == 2 else [pytest.mark.slow], id=f"{ranks}ranks-{path}")
        for ranks in (1, 2, 4) for path in paths if path in cases_for(ranks)
    ]


def splits_of(launched, ranks, path):
    reports = launched[ranks].case(path)
    for rank, report in enumerate(reports[1:], 1):
        assert report == reports[0], f"{path}: rank {rank} reports other numbers than rank 0"
    return reports[0]


@pytest.mark.parametrize("ranks, path", rank_params(PATHS))
def test_per_item_equals_the_global_item_mean(launched, ranks, path):
    norm_tolerance, update_tolerance = NORM_TOLERANCE[dtype_of(path)], UPDATE_TOLERANCE[dtype_of(path)]
    for split, row in splits_of(launched, ranks, path).items():
        print(f"{path} {ranks} ranks {split}: norm errors {row['norm_errors']}, update errors {row['update_errors']}")
        assert row["skipped_steps"] == 0, f"{split}: a step was skipped"
        assert all(error is not None and error <= norm_tolerance for error in row["norm_errors"]), (split, row)
        assert all(error <= update_tolerance for error in row["update_errors"]), (split, row)


@pytest.mark.parametrize("ranks, path", rank_params(PIPELINE_PATHS))
def test_pipeline_per_item_equals_the_global_item_mean(launched, ranks, path):
    """Counts come from the last stage; every stage divides by the global count, and train_batch()
    returns the global item mean loss."""
    norm_tolerance, update_tolerance = NORM_TOLERANCE[dtype_of(path)], UPDATE_TOLERANCE[dtype_of(path)]
    for split, row in splits_of(launched, ranks, path).items():
        print(f"{path} {ranks} ranks {split}: norm {row['norm_errors']}, loss {row['loss_errors']}, "
              f"update {row['update_errors']}")
        assert row["skipped_steps"] == 0, f"{split}: a step was skipped"
        assert all(error is not None and error <= norm_tolerance for error in row["norm_errors"]), (split, row)
        assert all(error <= norm_tolerance for error in row["loss_errors"]), (split, row)
        assert all(error <= update_tolerance for error in row["update_errors"]), (split, row)


@pytest.mark.parametrize("ranks, path", rank_params(MEAN_MODE + PIPELINE_MEAN_MODE))
def test_mean_mode_on_the_same_data_is_not_the_item_mean(launched, ranks, path):
    """Guard: on this data the per-micro-batch means miss the global item mean by far more than any
    tolerance, at every split with more than one micro-batch (so a per_item path that averaged means
    could not pass); one micro-batch of the whole batch (1 rank, GAS 1) is the item mean itself."""
    for split, row in splits_of(launched, ranks, path).items():
        if split == "32x1":  # every sample of the batch in one micro-batch (1 rank, or a pipeline's 1 DP)
            assert max(row["update_errors"]) <= UPDATE_TOLERANCE[dtype_of(path)], (split, row)
        else:
            assert min(row["update_errors"]) > 100 * UPDATE_TOLERANCE["fp32"], (split, row)


@pytest.mark.parametrize("path", ["zero1_fp32", "zero2_bf16_clip", "zero3_fp32_clip", "pipe2_zero1_fp32"])
def test_per_item_takes_no_extra_collective_or_host_read(launched, path):
    """N travels in the norm's collective (and the pipeline's loss in its loss all-reduce): per_item costs
    the collectives and host reads of mean mode; an engine step reads one value once running (ZeRO-3's
    first step reads more in both modes, setting up; train_batch() reads the loss too)."""
    per_item, mean = splits_of(launched, 2, path), splits_of(launched, 2, f"{path}_mean_mode")
    for split in per_item:
        assert per_item[split]["collectives"] == mean[split]["collectives"], split
        assert per_item[split]["host_reads"] == mean[split]["host_reads"], split
        if not path.startswith("pipe"):
            assert per_item[split]["host_reads"][2] == 1, split


@pytest.mark.parametrize(
    "path",
    ["zero0_fp32", "zero0_bf16_clip", "zero0_fp16_dynamic", "zero1_bf16_fp32_accumulation_clip", "pipe2_fp32_clip"])
def test_per_item_without_zero_takes_no_extra_collective(launched, path):
    """Without a ZeRO optimizer the gradients are all-reduced whole and no norm collective carries N: the
    count rides in the first gradient bucket's all-reduce (a pipeline's with the loss its last stage sends
    every stage), the all-reduce divides by it (no added pass), and the step reads it back for the
    empty-step check: the collectives of mean mode, and one host read more."""
    per_item, mean = splits_of(launched, 2, path), splits_of(launched, 2, f"{path}_mean_mode")
    for split in per_item:
        assert per_item[split]["collectives"] == mean[split]["collectives"], split
        assert per_item[split]["host_reads"] == [r + 1 for r in mean[split]["host_reads"]], split


@pytest.mark.parametrize("case", ["count_rides_in_the_bucket", "count_goes_alone_beyond_exact_digits"])
def test_the_count_is_exact_in_any_bucket_dtype(launched, case):
    """The count's digits sum exactly in fp32, fp16 and bf16 buckets, though sums such as 257 (bf16) and
    counts such as 2049 (fp16) are not representable in one element of the bucket; sums beyond 2**24 are
    exact to fp32's rounding. With more ranks than a bf16 digit can sum exactly, the count takes
    an all-reduce of its own first."""
    for rank, rows in enumerate(launched[2].case(case)):
        for row in rows:
            want = sum(row["counts"])
            assert abs(row["items"] - want) <= want * 2.0**-24, (rank, row)
            if want < 2**24:
                assert row["items"] == want, (rank, row)
            alone = case != "count_rides_in_the_bucket" and "bfloat16" in row["dtype"]
            assert row["collectives"] == (2 if alone else 1), (rank, row)


@pytest.mark.parametrize("case", NO_ITEMS)
def test_a_step_without_items_is_skipped(launched, case):
    for rank, result in enumerate(launched[2].case(case)):
        assert result == {"unchanged": True, "skipped_steps": 1, "norm": 0.0}, f"rank {rank}: {result}"


@pytest.mark.parametrize("case", {**REFUSALS, **PIPELINE_REFUSALS, **LAST_REFUSALS})
def test_bad_input_gets_a_clear_error(launched, case):
    kind, message = {**REFUSALS, **PIPELINE_REFUSALS, **LAST_REFUSALS}[case]
    for rank, error in enumerate(launched[2].case(case)):
        assert error is not None, f"rank {rank}: {case} was accepted"
        assert error["type"] == kind and message in error["message"], f"rank {rank}: {error}"
