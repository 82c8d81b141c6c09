# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""ds_gas_check: GAS invariance on many engine paths (2 CPU ranks, one launch), its negative controls,
and the command line.

Each case trains one global batch (3 steps) as micro-batch x GAS = 16x1, 8x2, 4x4, 2x8 per rank and
compares the reported grad norm and the fp32 master-weight update with an fp64 PyTorch run.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.gas_results import assert_single_rank_splits_pass, describe
from toolkit.launch import launch_cases
from helpers.repo import REPO
from helpers.selection import params_of, selected_items, selected_params

WORKER = REPO / "tests" / "workers" / "gas_checker.py"
MUST_PASS = [
    "zero0_fp32", "zero1_fp32", "zero2_fp32", "zero3_fp32", "zero1_fp32_clip", "zero2_fp32_adamw_clip", "zero0_bf16",
    "zero1_bf16", "zero2_bf16_clip", "zero1_bf16_fp32_accum_immediate", "zero0_fp16_static",
    "zero0_fp16_fused_adam_clip", "zero0_fp16_adamw_weight_decay", "zero2_fp16_dynamic", "zero1_offload_fp32",
    "zero2_offload_bf16_clip", "zero3_offload_fp32", "zero1_offload_fp32_clip", "zero3_offload_bf16_clip",
    "zero2_fp32_caller_divides", "zero1_fp32_boundary_loop", "zero3_bf16_boundary_loop", "zero1_fp32_allreduce_sum",
    "zero2_bf16_allreduce_sum_clip", "zero0_fp32_unmanaged", "zero2_fp32_unmanaged", "pipe2_fp32_clip",
    "zero1_fp32_muon_clip", "zero3_fp32_muon_clip", "zero2_offload_fp32_muon_clip", "zero2_offload_fp32_adagrad_clip",
    "zero2_offload_fp32_lion_clip", "zero2_fp32_small_buckets", "zero3_fp32_small_buckets",
    "zero2_fp32_torch_adamw_default_decay"
]
# The engine's other ways to reduce, fetch and place (docs/reference/engine_surface.md). round_robin_gradients failed
# on 0.19.8: its fp32 fragments, which the check reads, held other parameters' elements (patch
# Map-each-round-robin-ordered-parameter-to-its-own-fp).
ENGINE_SURFACE = [
    "zero1_fp32_round_robin", "zero2_fp32_round_robin", "zero2_fp32_overlap_comm",
    "zero2_fp32_no_contiguous_gradients", "zero2_fp32_single_rank_buckets", "zero2_fp32_no_allgather_partitions",
    "zero2_fp32_disable_allgather", "zero3_fp32_no_overlap_no_contiguous", "zero3_fp32_fetch_one_at_a_time",
    "zero3_offload_param_fp32", "zero2_bf16_fp32_communication", "zero1_fp32_no_grad_norm", "zero2_fp32_no_grad_norm",
    "zero3_fp32_hpz", "zero3_fp32_fetch_by_all_reduce", "zero3_fp32_allgather_sequential", "zero0_autocast_bf16",
    "zero2_autocast_bf16", "zero2_fp32_warmup_lr", "zero3_offload_fp32_warmup_lr", "zero1_bf16_warmup_decay_lr",
    "zero0_fp16_one_cycle", "zero0_fp32_torch_step_lr", "zero2_fp32_torch_cosine_lr", "zero1_bf16_master_adam_clip",
    "zero3_bf16_master_sgd_clip", "zero3_fp32_leaf_module_small_buckets", "zero2_fp32_cpu_offload_alias",
    "zero3_fp32_cpu_offload_aliases", "zero2_bf16_parameter_alignment", "zero2_autocast_bf16_no_lowered_modules",
    "zero2_fp16_auto_cast", "zero2_bf16_no_overflow_check_clip", "zero2_offload_fp16_master_adam_clip",
    "zero3_offload_fp32_partial_ratio", "pipe2_fp32_checkpointed_clip", "pipe2_fp32_non_reentrant_checkpointed_clip",
    "zero3_fp32_hybrid_engine_clip", "zero2_bf16_hybrid_engine_clip", "zero3_fp32_zero_init_clip",
    "zero3_bf16_zero_init_torch_linear_clip", "zero3_fp32_zero_init_module_apply_clip", "zero3_fp32_qgz_one_node_clip",
    "zero3_fp32_zero_init_muon_clip", "zero1_fp32_compiled_clip", "zero2_bf16_compiled_clip",
    "zero3_fp32_compiled_clip", "zero0_fp16_compiled"
]
MUST_PASS += ENGINE_SURFACE

# Left out of CI's launch (CI's 30 minutes), each beside a case that takes the same engine path: zero3_fp32
# (zero3_offload_fp32), zero1_offload_fp32 (its _clip), zero1_bf16 (zero2_bf16_clip, zero1_bf16_fp32_accum),
# zero1_fp32_allreduce_sum (zero2_bf16_allreduce_sum_clip), zero2_fp32_unmanaged (zero0_fp32_unmanaged); the
# per_item cases without a ZeRO optimizer (tests/test_per_item_loss.py runs those paths in CI).
SLOW_CASES = [
    "zero3_fp32", "zero1_offload_fp32", "zero1_bf16", "zero1_fp32_allreduce_sum", "zero2_fp32_unmanaged",
    "zero0_fp32_clip_per_item_variable_items", "zero1_bf16_fp32_accum_per_item_variable_items",
    "pipe2_bf16_per_item_variable_items"
]
# Also slow since 2026-11-24 (CI's 30 minutes): plain ZeRO-1/2 fp32 (zero1_fp32_clip, zero1_fp32_boundary_loop,
# zero2_fp32_adamw_clip and zero2_fp32_caller_divides run those paths), patch
# Grow-the-dynamic-loss-scale-only-after-unscaling-the's scale growth on ZeRO-1/2 (CI keeps ZeRO-0 and 3).
SLOW_CASES += ["zero1_fp32", "zero2_fp32", "zero1_fp16_scale_growth", "zero2_fp16_scale_growth"]
# Offload with DeepSpeed's CPU Adagrad and Lion (each a JIT build of its own) and Muon's offload path: the full
# optimizer table (tests/test_optimizer_updates.py) covers them; CI keeps Muon on ZeRO-1 and 3.
SLOW_CASES += ["zero2_offload_fp32_muon_clip", "zero2_offload_fp32_adagrad_clip", "zero2_offload_fp32_lion_clip"]
# --small-buckets: CI runs ZeRO-3 (prefetch, persistence, sub-groups); ZeRO-1/2 and the bucket-bug control slow.
SLOW_CASES += ["zero2_fp32_small_buckets"]
# The engine-surface cases: CI keeps round robin on ZeRO-2 (0.19.8's failure), parameter offload on ZeRO-3, the two the
# check once failed on a right engine (torch autocast's bf16 rounding, a learning-rate schedule), a torch scheduler
# from the config under ZeRO-2 (0.19.8's engine raised TypeError building it), and a model built under zero.Init and
# initialised through Module.apply (0.19.8's apply returned None: patch
# Return-the-module-from-Module.apply-under-zero.Init).
CI_ENGINE_SURFACE = ("zero2_fp32_round_robin", "zero3_offload_param_fp32", "zero2_autocast_bf16",
                     "zero2_fp32_warmup_lr", "zero1_bf16_master_adam_clip", "zero3_fp32_zero_init_module_apply_clip")
SLOW_CASES += [case for case in ENGINE_SURFACE if case not in CI_ENGINE_SURFACE]

# The cases each test of the 2-rank launch without a ``case`` parameter reads by name.
CASES_READ_BY = {
    "test_pipeline_averages_micro_batches": ["pipe2_fp32", "pipe2_bf16"],
    "test_bf16_optimizer_keeps_last_micro_batch_in_cross_rank_average": ["zero1_bf16_fp32_accum"],
    "test_control_forgetting_to_divide_is_caught_as_gas": ["control_forgets_to_divide"],
    "test_bf16_master_weights_control_never_passes": ["control_bf16_master_drops_micro_batch"],
    "test_bf16_master_weights_sgd_control_fails": ["control_bf16_master_sgd_forgets_to_divide"],
    "test_control_loss_times_world_is_caught_as_world_size": ["control_multiplies_by_world"],
    "test_control_constant_factor_names_no_cause": ["control_constant_factor"],
    "test_no_reference_mode_compares_splits": ["zero1_fp32_no_reference"],
    "test_no_reference_variable_items_no_false_alarm":
    ["zero3_fp32_variable_items_no_reference", "zero2_bf16_variable_items_no_reference"],
    "test_control_dropped_micro_batch_fails_without_reference": ["control_drops_micro_batch_no_reference"],
    "test_user_pipeline_module_with_clipping": ["pipe2_user_transformer_clip"],
    "test_mean_mode_reports_the_bias_of_micro_batch_means": ["zero1_fp32_mean_variable_items"],
    "test_bf16_muon_is_never_failed_for_rounding": ["zero2_bf16_muon_clip"],
    "test_small_buckets_reveal_a_bucket_bug": ["control_bucket_bug_needs_small_buckets"],
    "test_a_step_the_engine_skips_is_reported": ["control_inf_gradient_in_step_2"],
    "test_each_split_is_gathered_in_one_collective": ["comparison_collectives"],
    "test_control_mislabelled_sequence_parallel_loss_fails": ["control_sp2_gathered_loss_declared_as_share"],
    "test_nvme_offload":
    ["zero3_nvme_offload_fp32", "zero3_nvme_offload_fp32_buffers", "zero3_nvme_offload_muon_momentum_in_memory"],
}


def cases_read_by(item):
    params = params_of(item)
    if "case" in params:
        return [params["case"]]
    if item.originalname not in CASES_READ_BY:
        raise LookupError(f"{item.nodeid} uses the 2-rank launch but names no case: add its cases to CASES_READ_BY")
    return CASES_READ_BY[item.originalname]


def launch_order(cases):
    """The worker's rule: pipeline cases last (the pipeline grid stays in deepspeed.utils.groups for the rest
    of the process), sequence-parallel ones just before them (their groups stay too)."""
    return sorted(cases, key=lambda case: (case.startswith("pipe"), "_sp2" in case))


@pytest.fixture(scope="module")
def launched(extensions_dir, request):
    # The cases of the tests this run selected (-k narrows the launch; slow ones run with --run-slow only).
    read = dict.fromkeys(case for item in selected_items(request, "launched") for case in cases_read_by(item))
    return launch_cases(WORKER, nprocs=2, cases=launch_order(read), extensions_dir=extensions_dir, timeout=1200)


@pytest.mark.parametrize(
    "case", [pytest.param(case, marks=[pytest.mark.slow] if case in SLOW_CASES else []) for case in MUST_PASS])
def test_gas_invariant(launched, case):
    assert [r["name"] for r in launched.case(case)[0]] == ["16 x 1 x 2", "8 x 2 x 2", "4 x 4 x 2", "2 x 8 x 2"]
    assert_gas_invariant(launched, case)


def assert_gas_invariant(launched, case):
    ranks = launched.case(case)
    for rank, rows in enumerate(ranks):
        assert all(r["passed"] for r in rows), f"rank {rank}:\n{describe(rows)}"
    assert all(rows == ranks[0] for rows in ranks), "ranks disagree about the same check"


@pytest.mark.slow
def test_bf16_muon_is_never_failed_for_rounding(launched):
    """Muon in bf16: Newton-Schulz lifts the rounding of a gradient's small directions to full size (the
    built-in model's update moves 6e-2 in plain PyTorch bf16, over the 5e-2 cap), so a correct engine's splits
    are PASS or UNRESOLVED, never FAIL; the grad norm still has to agree (0.19.8 reports the Muon update's, 5x
    the gradient's, and fails)."""
    for rank, rows in enumerate(launched.case("zero2_bf16_muon_clip")):
        assert all(r["verdict"] in ("PASS", "UNRESOLVED") for r in rows), f"rank {rank}:\n{describe(rows)}"
        assert all(r["norm_error"] <= r["tolerance"] for r in rows), f"rank {rank}:\n{describe(rows)}"


@pytest.mark.slow
def test_small_buckets_reveal_a_bucket_bug(launched):
    """Negative control for --small-buckets: a seeded bug doubles every gradient bucket reduced after the first
    of a backward. The built-in model fits DeepSpeed's default bucket, so the default check passes; with small
    buckets it spans several and the check fails."""
    for rank, result in enumerate(launched.case("control_bucket_bug_needs_small_buckets")):
        assert all(r["passed"] for r in result["default"]), f"rank {rank}:\n{describe(result['default'])}"
        assert not any(r["passed"]
                       for r in result["small_buckets"]), f"rank {rank}:\n{describe(result['small_buckets'])}"


def async_io_missing():
    """Why DeepSpeed's async_io op (NVMe offload) cannot build here, or None."""
    from deepspeed.accelerator import get_accelerator
    builder = get_accelerator().create_op_builder("AsyncIOBuilder")
    if builder is None or not builder.is_compatible(False):
        return "NVMe offload needs DeepSpeed's async_io op, which needs libaio (Debian: libaio-dev)"
    return None


ASYNC_IO_MISSING = async_io_missing()  # once per collection: the probe compiles against libaio


@pytest.mark.slow
@pytest.mark.skipif(ASYNC_IO_MISSING is not None, reason=str(ASYNC_IO_MISSING))
def test_nvme_offload(launched):
    """ZeRO-Infinity: ZeRO-3 with optimizer states and parameters swapped to NVMe (a directory), pipelined; with more
    swap buffers and fast initialisation; Muon's momentum kept in memory."""
    for case in CASES_READ_BY["test_nvme_offload"]:
        assert_gas_invariant(launched, case)


SCALE_GROWTH = [f"zero{stage}_fp16_scale_growth" for stage in range(4)]


def test_pipeline_averages_micro_batches(launched):
    """Regression, upstream #7773 (0.16.0-0.18.2: pipeline gradients summed over micro-batches, update x GAS)
    and #8152 (0.18.x: 1/GAS on the early stages)."""
    assert_gas_invariant(launched, "pipe2_fp32")
    assert_gas_invariant(launched, "pipe2_bf16")


def test_bf16_optimizer_keeps_last_micro_batch_in_cross_rank_average(launched):
    """Regression, upstream PR #7985 (up to 0.18.x: BF16_Optimizer, ZeRO-1 with fp32 gradient accumulation,
    added the last micro-batch after the cross-rank all-reduce)."""
    assert_gas_invariant(launched, "zero1_bf16_fp32_accum")


@pytest.mark.parametrize(
    "case", [pytest.param(case, marks=[pytest.mark.slow] if case in SLOW_CASES else []) for case in SCALE_GROWTH])
def test_fp16_update_on_the_step_the_loss_scale_grows(launched, case):
    """Regression (patch Grow-the-dynamic-loss-scale-only-after-unscaling-the): the dynamic loss scale grew before the
    gradients were unscaled, so the step on which it grows applied half its update (every step after the first with
    loss_scale_window 1)."""
    assert_gas_invariant(launched, case)


def test_control_forgetting_to_divide_is_caught_as_gas(launched):
    """scale_wrt_gas=False without dividing: every GAS>1 split fails, diagnosed as summed over micro-batches."""
    rows = launched.case("control_forgets_to_divide")[0]
    assert rows[0]["passed"], "GAS=1 is unaffected"
    for row in rows[1:]:
        assert not row["passed"]
        assert row["update_factor"] == pytest.approx(row["gas"], rel=1e-3)
        assert any("summed over micro-batches" in line for line in row["diagnosis"]), row["diagnosis"]


def test_bf16_master_weights_control_never_passes(launched):
    """bf16 master weights round Adam's steps (the check's plain-PyTorch run keeps them so too, and the right engine
    passes): a micro-batch dropped under accumulation still passes no GAS > 1 split."""
    rows = launched.case("control_bf16_master_drops_micro_batch")[0]
    assert rows[0]["passed"], "GAS=1 is unaffected"
    assert [row["verdict"] for row in rows[1:]] == ["FAIL"] * 3, describe(rows)


@pytest.mark.slow
def test_bf16_master_weights_sgd_control_fails(launched):
    """ZeRO-3, SGD, bf16 master weights: micro-batch gradients summed fail every GAS > 1 split, diagnosed as such."""
    rows = launched.case("control_bf16_master_sgd_forgets_to_divide")[0]
    assert rows[0]["passed"], "GAS=1 is unaffected"
    for row in rows[1:]:
        assert row["verdict"] == "FAIL", describe(rows)
        assert any("summed over micro-batches" in line for line in row["diagnosis"]), row["diagnosis"]


def test_a_step_the_engine_skips_is_reported(launched):
    """An inf in one rank's loss in step 2: every split skips that step, and the report says so, split by split."""
    result = launched.case("control_inf_gradient_in_step_2")[0]
    assert result["skipped"] and all(count == 1 for count in result["skipped"]), result["skipped"]
    lines = [line for line in result["report"].splitlines() if "the engine skipped 1 of 3 step(s)" in line]
    assert len(lines) == len(result["skipped"]), result["report"]


@pytest.mark.fork_only
def test_each_split_is_gathered_in_one_collective(launched):
    """The comparison sums a split's numbers over the ranks once (0.19.8+gafix.3's checker, with the reference: 4
    times per split in fp32, 5 in bf16 and fp16)."""
    counts = launched.case("comparison_collectives")[0]
    assert counts["with_reference"] == counts["splits"], counts
    assert counts["without_reference"] == 2 * counts["splits"] - 1, counts


def test_control_loss_times_world_is_caught_as_world_size(launched):
    rows = launched.case("control_multiplies_by_world")[0]
    for row in rows:
        assert not row["passed"]
        assert row["update_factor"] == pytest.approx(2, rel=1e-3)
        assert any("world size (2)" in line for line in row["diagnosis"]), row["diagnosis"]


def test_control_constant_factor_names_no_cause(launched):
    """x0.7349 on every split: near (GAS-1)/GAS at GAS 4 only, so no cause is named; the numbers are."""
    rows = launched.case("control_constant_factor")[0]
    for row in rows:
        assert not row["passed"]
        assert row["update_factor"] == pytest.approx(0.7349, rel=1e-3)
        assert row["diagnosis"][0].startswith("no known cause"), row["diagnosis"]
        assert "GAS 4: x0.7349" in row["diagnosis"][0]
        assert not any("dropped" in line for line in row["diagnosis"]), row["diagnosis"]


def test_no_reference_mode_compares_splits(launched):
    rows = launched.case("zero1_fp32_no_reference")[0]
    assert [r["compared_with"] for r in rows] == ["itself"] + ["split 16 x 1 x 2"] * 3
    assert all(r["passed"] for r in rows), describe(rows)
    assert all(r["update_errors"][-1] < 1e-5 for r in rows[1:])


def test_no_reference_variable_items_no_false_alarm(launched):
    """Without a reference, micro-batches of different item counts: a split's loss is the mean of its micro-batch
    means by design, so each split is compared with its own micro-batches trained without accumulation (compared
    with the first split, the correct engine failed with errors of 2e-1 and a bf16 cause it did not have)."""
    for case in ("zero3_fp32_variable_items_no_reference", "zero2_bf16_variable_items_no_reference"):
        rows = launched.case(case)[0]
        assert [r["compared_with"] for r in rows] == ["itself"] + ["the same micro-batches without accumulation"] * 3
        assert all(r["passed"] for r in rows), describe(rows)
        assert not any(r["diagnosis"] for r in rows), describe(rows)


def test_control_dropped_micro_batch_fails_without_reference(launched):
    """The same check catches a micro-batch dropped under accumulation (GAS 1 is right, so it passes)."""
    rows = launched.case("control_drops_micro_batch_no_reference")[0]
    assert [r["verdict"] for r in rows] == ["PASS", "FAIL", "FAIL", "FAIL"], describe(rows)
    assert all(r["update_errors"][0] > 10 * r["tolerance"] for r in rows[1:]), describe(rows)


def test_user_pipeline_module_with_clipping(launched):
    """A user's PipelineModule (--model) on token batches (--data): its reference is built from the layer list.
    Fails on 0.19.8, whose clip norm misses the other stage (patch Count-every-pipeline-stage-in-clip_grad_norm_)."""
    ranks = launched.case("pipe2_user_transformer_clip")
    assert [r["name"] for r in ranks[0]] == ["4 x 1 x 2", "2 x 2 x 2", "1 x 4 x 2"]
    assert_gas_invariant(launched, "pipe2_user_transformer_clip")


@pytest.mark.fork_only  # pristine DeepSpeed has no loss_normalization
@pytest.mark.parametrize("case", [
    pytest.param(case, marks=[pytest.mark.slow] if case in SLOW_CASES else []) for case in [
        "zero2_bf16_clip_per_item_variable_items", "zero3_fp32_per_item_variable_items",
        "pipe2_zero1_fp32_clip_per_item_variable_items", "zero0_fp32_clip_per_item_variable_items",
        "zero1_bf16_fp32_accum_per_item_variable_items", "pipe2_bf16_per_item_variable_items"
    ]
])
def test_per_item_mode_against_the_global_item_mean(launched, case):
    """--items variable with "loss_normalization": "per_item": every split equals the fp64 mean over
    every item of the global batch (the reference of one micro-batch of the whole batch), no gap note."""
    assert_gas_invariant(launched, case)
    for row in launched.case(case)[0]:
        assert row["compared_with"] == "fp64 reference"
        assert math.isnan(row["loss_normalization_gap"]), row["name"]


@pytest.mark.fork_only
def test_mean_mode_reports_the_bias_of_micro_batch_means(launched):
    """--items variable in mean mode: DeepSpeed's contract holds (each split matches the mean of its
    micro-batch means), and the check reports how far that is from the global item mean: well above the
    tolerance at every split on this data."""
    case = "zero1_fp32_mean_variable_items"
    assert_gas_invariant(launched, case)
    for row in launched.case(case)[0]:
        assert row["loss_normalization_gap"] > 100 * row["tolerance"], (row["name"], row["loss_normalization_gap"])


def test_command_line_on_example_config(tmp_path, extensions_dir):
    """`ds_gas_check --ranks 2` launches itself, prints the table and exits 0 on a good config."""
    results = tmp_path / "results.json"
    command = Path(sys.executable).with_name("ds_gas_check")
    proc = subprocess.run([
        str(command), "--config",
        str(REPO / "examples" / "configs" / "zero2_bf16.json"), "--ranks", "2", "--splits", "4x1,2x2,1x4", "--json",
        str(results)
    ],
                          stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT,
                          text=True,
                          timeout=900,
                          env=dict(os.environ, TORCH_EXTENSIONS_DIR=str(extensions_dir)))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "ZeRO 2, bf16, optimizer SGD, 3 steps" in proc.stdout
    assert "split (micro x GAS x ranks)" in proc.stdout
    rows = json.loads(results.read_text())
    assert [(r["name"], r["passed"]) for r in rows] == [("4 x 1 x 2", True), ("2 x 2 x 2", True), ("1 x 4 x 2", True)]


@pytest.mark.fork_only
@pytest.mark.parametrize("args, message", [
    (["--config", "/nonexistent/ds.json"], "--config /nonexistent/ds.json: No such file or directory"),
    (["--config", "{config}", "--splits", "4x1,3x"], "--splits '4x1,3x': expected e.g. 16x1,8x2"),
    (["--config", "{config}", "--model", "nomodule"], "--model 'nomodule': expected 'module:function'"),
    (["--config", "{config}", "--ranks", "3", "--sequence-parallel", "2"], "--sequence-parallel 2 does not divide 3 "
     "ranks"),
    (["--config", "{config}", "--sequence-parallel", "2", "--model", "m:f"
      ], "--sequence-parallel checks the built-in self-attention model"),
])
def test_command_line_bad_input(tmp_path, capsys, args, message):
    # In this process: every such error is found before deepspeed is initialized.
    from deepspeed.gafix.gas_check.cli import main
    config = tmp_path / "ds.json"
    config.write_text("{}")
    assert main([a.format(config=config) for a in args]) == 2
    assert f"ds_gas_check: error: {message}" in capsys.readouterr().err


SINGLE_RANK = [
    "zero0_fp32", "zero2_bf16_clip", "zero3_fp32", "zero0_fp16_static", "zero1_fp32_boundary_loop",
    "zero0_fp16_adamw_clip"
]
SINGLE_RANK_CONTROLS = ["control_fp16_adamw_drops_micro_batch"]


@pytest.fixture(scope="module")
def launched_single(extensions_dir, request):
    # The cases of the tests this run selected (-k narrows the launch).
    cases = selected_params(request, "case", "launched_single")
    return launch_cases(WORKER, nprocs=1, cases=cases, extensions_dir=extensions_dir, timeout=900)


@pytest.mark.parametrize("case", SINGLE_RANK)
def test_gas_invariant_single_rank(launched_single, case):
    (rows, ) = launched_single.case(case)
    assert_single_rank_splits_pass(rows)


@pytest.mark.parametrize("case", SINGLE_RANK_CONTROLS)
def test_control_dropped_micro_batch_fails_in_fp16_with_adam(launched_single, case):
    # zero0_fp16_adamw_clip passes where its update is off fp64 by fp16's rounding (plain PyTorch in fp16 is
    # off the same way); a dropped micro-batch is off both, on every split.
    (rows, ) = launched_single.case(case)
    assert not any(r["passed"] for r in rows), describe(rows)
    for r in rows:
        assert r["floor_update_errors"][0] > r["tolerance_for_dtype"], describe(rows)


PIPELINE_2X2 = ["pipe2_fp32", "pipe2_fp32_clip", "pipe2_bf16"]


@pytest.fixture(scope="module")
def launched_four(extensions_dir, request):
    # slow: the 2-rank launch has the same pipeline cases; 2 stages x 2 data-parallel ranks add the
    # cross-replica reduction (CI's 30 minutes do not hold a third launch).
    """4 ranks = 2 pipeline stages x 2 data-parallel ranks."""
    cases = selected_params(request, "case", "launched_four")
    return launch_cases(WORKER, nprocs=4, cases=launch_order(cases), extensions_dir=extensions_dir, timeout=900)


@pytest.mark.slow
@pytest.mark.parametrize("case", PIPELINE_2X2)
def test_gas_invariant_pipeline_2x2(launched_four, case):
    assert [r["name"] for r in launched_four.case(case)[0]] == ["16 x 1 x 4", "8 x 2 x 4", "4 x 4 x 4", "2 x 8 x 4"]
    assert_gas_invariant(launched_four, case)


# Ulysses sequence parallelism (ds_gas_check --sequence-parallel 2): CI runs ZeRO-3 with each rank's share of the
# loss (0.19.8's reduce-scatter halves it: norm 0.5x fp64's, upstream #5248); the gathered loss (ALST's recipe; 0.19.8
# adds the SP ranks' gradients on ZeRO-1: norm 2x) and a bf16 gradient reduction slow.
SEQUENCE_PARALLEL = [
    "zero3_fp32_sp2_clip", "zero3_fp32_sp2_gathered_clip", "zero1_bf16_sp2_gathered",
    "zero2_bf16_sp2_gathered_comm_bf16"
]
SEQUENCE_PARALLEL_SLOW = SEQUENCE_PARALLEL[1:]


@pytest.mark.parametrize("case", [
    pytest.param(case, marks=[pytest.mark.slow] if case in SEQUENCE_PARALLEL_SLOW else [])
    for case in SEQUENCE_PARALLEL
])
def test_gas_invariant_sequence_parallel(launched, case):
    assert [r["name"] for r in launched.case(case)[0]] == ["8 x 1 x 2", "4 x 2 x 2"]
    assert_gas_invariant(launched, case)


@pytest.mark.slow
@pytest.mark.parametrize("case", SEQUENCE_PARALLEL[:2])
def test_gas_invariant_sequence_parallel_dp2(launched_four, case):
    """Sequence parallel 2 x data parallel 2."""
    assert [r["name"] for r in launched_four.case(case)[0]] == ["8 x 1 x 4", "4 x 2 x 4"]
    assert_gas_invariant(launched_four, case)


@pytest.mark.fork_only  # 0.19.8 cannot be told how the loss is written
def test_control_mislabelled_sequence_parallel_loss_fails(launched):
    """The gathered loss backpropagated where the engine is told each rank writes its share: every split fails,
    its norm twice fp64's."""
    for rank, rows in enumerate(launched.case("control_sp2_gathered_loss_declared_as_share")):
        assert not any(r["passed"] for r in rows), f"rank {rank}:\n{describe(rows)}"
        assert all(r["norm_factor"] == pytest.approx(2.0, rel=1e-3) for r in rows), describe(rows)
