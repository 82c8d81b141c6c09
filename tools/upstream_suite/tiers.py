# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The named selections of upstream's tests (docs/develop/upstream_suite.md explains each).

- ``patch``: the upstream test files that exercise what each patch of patches/series touches; run by
  the test suite (CI) on the fork against a recorded pristine baseline.
- ``full``: every unit-test directory that can run on a CPU; hours on 2 cores, resumable.
- ``gpu``: fp16 (half_precision/) and the CUDA-only tests of the patch tier, for a GPU machine.
"""

from dataclasses import dataclass
from pathlib import Path

from upstream_suite.execute import Unit


@dataclass(frozen=True)
class Covered:
    unit: Unit
    patches: tuple  # patch numbers ("0003", ...) whose changed code the unit runs
    what: str  # what of those patches it exercises


def _covered(path, patches, what, keyword=""):
    return Covered(Unit(path, keyword), tuple(patches.split()), what)


# The fork side of this tier runs in CI beside our own suite (CI's budget: 30 minutes in all), so files
# with many slow distributed cases are narrowed with -k to the cases that run the patched code; the
# full tier runs every case of every file.
PATCH_TIER = (
    _covered("unit/runtime/test_runtime_utils.py", "0003 0011", "clip_grad_norm_ and CheckOverflow (utils.py)"),
    _covered("unit/runtime/test_precision_config_dynamic_scale.py", "0005 0014",
             "dynamic loss scale settings (fp16 config)"),
    _covered("unit/runtime/test_precision_config_loss_scale.py", "0004", "static loss scale settings (fp16 config)"),
    _covered("unit/v1/half_precision/test_gradient_clipping_default.py", "0003 0011 0012 0026",
             "the default gradient clipping, end to end (0026: the no-ZeRO norm's walk over the gradients)"),
    _covered("unit/runtime/pipe/test_pipe.py",
             "0003 0012 0013 0022 0023",
             "pipeline gradient accumulation scaling (0022: the loss aggregation of mean mode, unchanged; 0023: "
             "the ZeRO-0 gradient all-reduce of mean mode)",
             keyword="TestPipeGradientAccumulationScaling"),
    _covered("unit/runtime/test_no_sync_ctxt.py",
             "0002 0006 0009 0020 0021",
             "no_sync and engine.backward on ZeRO-1/3 (the shm comm op at init; 0020/0021: the ZeRO steps in "
             "mean mode)",
             keyword="test_zero_stage[3-dtype2] or test_engine_step[1-dtype2] or test_reentry"),
    _covered("unit/comm/test_dist.py",
             "0002",
             "deepspeed.comm all-reduce and the shm inference_all_reduce",
             keyword="TestInit or (TestDistAllReduce and 3) or (TestDistInferenceAllReduce and 128-dtype1)"),
    _covered("unit/v1/moe/test_moe.py",
             "0009 0017 0025",
             "MoE expert gradients with ZeRO 0/1/2 (0025: which gradients count as replicas)",
             keyword="TestExpertWeightGradWithZero"),
    _covered("unit/v1/zero/test_zero_cpu_offload_grad_accum.py", "0009 0020",
             "ZeRO offload with gradient accumulation (0020: its mean mode, unchanged)"),
    _covered("unit/v1/moe/test_autoep_unit.py",
             "0030",
             "AutoEP finding and converting MoE layers, a Transformers Mixtral among them (its router-logit test "
             "fails on 0.19.8 with the output-capture registry's TypeError; passes with 0030)",
             keyword="TestModelDetectionAndReplacement"),
    _covered("unit/runtime/test_multi_output_model.py", "0006 0020 0023",
             "engine.backward of several losses under GAS (0023: bf16 ZeRO-0's gradient all-reduce, mean mode)"),
    _covered("unit/v1/accelerator/test_accelerator.py",
             "0007",
             "every accelerator (the CPU one included) is complete (its pin-memory cases JIT-build an op no patch "
             "touches, about 90 s: full tier)",
             keyword="test_abstract_methods_defined"),
    _covered("unit/ops/test_op_builder.py", "0015 0016", "the op builder (JIT arch lists, compatibility probes)"),
)

# Upstream files that reach patched code but stay out of the CI tier (the full tier runs them), and why.
FULL_TIER_COVERAGE = (
    _covered(
        "unit/runtime/pipe/test_pipe.py", "0013",
        "dynamic shapes through the pipeline's buffers (TestPipeDynamicShape: about 130 s of CI's budget); "
        "tests/test_engine_updates.py and test_gas_check.py run 2-stage pipelines through those buffers in "
        "fp32 and bf16"),
    _covered(
        "unit/v1/zero/test_zero2_offload_multi_backward.py", "0006 0009",
        "ZeRO-2 offload with several backward calls and GAS > 1: JIT-builds CPUAdam first (about 130 s of "
        "CI's budget); tests/test_engine_updates.py and test_gas_check.py cover offload under GAS"),
    _covered(
        "unit/runtime/half_precision/test_zero_optim_overflow.py", "0005 0009 0010",
        "ZeRO overflow detection: the bf16 cases JIT-build FusedAdam first (about 160 s of CI's budget); "
        "tests/test_global_grad_norm.py covers ZeRO-2/3 overflow"),
    _covered("unit/runtime/zero/test_zero_grad_clip.py", "0010 0021",
             "ZeRO-3 grad clipping and norm groups: each case JIT-builds an Adam op, about 100 s here"),
    _covered("unit/v1/half_precision/test_bf16.py", "0008 0009 0018 0027 0028",
             "bf16 gradients against DDP: skip on a CPU (they ask for CUDA and NCCL); GPU tier"),
    _covered(
        "unit/checkpoint/test_pipeline.py", "0009 0012 0013",
        "pipeline checkpoints: fail on pristine 0.19.8 too on a CPU (fp16; PipelineEngine has no "
        "sparse_tensor_module_names); tests/test_checkpoint_swap.py covers the pipeline instead"),
    _covered("unit/ops/muon/test_muon.py", "0019",
             "Muon on ZeRO 1-3, fp16, clipping 1.0: skips on a CPU (no fp16 there); GPU tier"),
    _covered("unit/checkpoint/test_moe_checkpoint.py", "0009 0017",
             "MoE checkpoints: fp16 only, fail on pristine 0.19.8 too on a CPU; GPU tier"),
    _covered(
        "unit/runtime/zero/test_ignore_unused_parameters.py", "0009",
        "ZeRO-2 offload with a parameter unused in the loss (0009's _check_unused_parameters): JIT-builds "
        "CPUAdam first (about 130 s of CI's budget); the full tier found 0009's regression there"),
    _covered(
        "unit/v1/moe/test_autoep_integration.py", "0029",
        "AutoEP on ZeRO-3: training steps, checkpoints and expert replica groups, each step choosing the norm's "
        "path (about 10 minutes of distributed cases here); tests/test_autoep_norm.py covers it with --run-slow"),
    _covered(
        "unit/ulysses_alst/test_ulysses_sp_hf.py", "0034",
        "ALST's gathered loss on ZeRO-2/3 against a run without SP: loads a hub model, so it fails on both sides "
        "here (no network); with a local stand-in its ZeRO-2 case shows 0.19.8's doubled gradient; "
        "tests/test_sp_norm.py covers every stage against fp64"),
)

# Patches whose changed lines no upstream test runs on a CPU, and why (docs/develop/upstream_suite.md repeats it).
UNCOVERED = {
    "0001": "the version label and ds_report section: no upstream test reads them",
    "0004": "fp16 ZeRO-0 loss scaling: upstream's fp16 training tests (half_precision/) skip on a CPU; GPU tier",
    "0005": "fp16 loss-scale growth: upstream's fp16 training tests skip on a CPU; GPU tier",
    "0008": "BF16_Optimizer's norm: upstream tests it on CUDA (GPU tier); its helper runs under 0009-0012's",
    "0014": "fp16 ZeRO-0 optimizers' construction: upstream's fp16 training tests skip on a CPU; GPU tier",
    "0018": "BF16_Optimizer's and the fp16 ZeRO-0 optimizers' clipping step: upstream tests them on CUDA; GPU tier",
    "0024": "the MoE token gather under tensor parallelism: upstream's test_moe_tp.py runs no forward",
    "0026": "BF16_Optimizer's MoE norm: no upstream test steps it with MoE layers (AutoEP's bf16 test stubs it)",
    "0027": "BF16_Optimizer's norm on a rank with no gradient to count: upstream runs BF16_Optimizer on CUDA only",
    "0028": "BF16_Optimizer under AutoEP + AutoTP folding: upstream's folding tests stub BF16_Optimizer or run fp32",
}

# Directories left out of the full tier: they need CUDA kernels (they skip or fail to import on a CPU).
GPU_ONLY_DIRS = (
    "unit/inference",
    "unit/hybrid_engine",
    "unit/ops/transformer",
    "unit/ops/sparse_attention",
    "unit/ops/spatial",
    "unit/ops/quantizer",
    "unit/ops/fp_quantizer",
    "unit/ops/deepspeed4science",
    "unit/v1/ops",
    "unit/v1/nvme",
    "unit/module_inject",
)

GPU_TIER_DIRS = ("unit/runtime/half_precision", "unit/v1/half_precision")


def test_files(tests_dir, under="unit"):
    """Every test_*.py below ``under``, as paths relative to ``tests_dir``, sorted."""
    root = Path(tests_dir)
    return sorted(str(path.relative_to(root)) for path in (root / under).rglob("test_*.py"))


def _is_under(path, directories):
    return any(path == directory or path.startswith(directory + "/") for directory in directories)


def units(tier, tests_dir):
    """The units of a named tier, in run order."""
    if tier == "patch":
        return [covered.unit for covered in PATCH_TIER]
    if tier == "full":
        return [Unit(path) for path in test_files(tests_dir) if not _is_under(path, GPU_ONLY_DIRS)]
    if tier == "gpu":
        patch_paths = [covered.unit.path for covered in PATCH_TIER]
        half = [path for path in test_files(tests_dir) if _is_under(path, GPU_TIER_DIRS)]
        return [Unit(path) for path in dict.fromkeys(half + patch_paths)]
    raise ValueError(f"unknown tier {tier!r}: choose patch, full or gpu")


def patch_table():
    """Markdown: each patch -> the upstream test files that cover it (docs/develop/upstream_suite.md)."""
    by_patch = {}
    for covered in PATCH_TIER + FULL_TIER_COVERAGE:
        for patch in covered.patches:
            by_patch.setdefault(patch, []).append(covered)
    lines = [
        "| patch | upstream tests that run its code (CI's patch tier; *full tier only* where marked) |", "|---|---|"
    ]
    for patch in sorted(set(by_patch) | set(UNCOVERED)):
        cells = [(f"`{covered.unit.key}` ({covered.what})"
                  if covered in PATCH_TIER else f"*full tier only*: `{covered.unit.path}` ({covered.what})")
                 for covered in by_patch.get(patch, [])]
        if patch in UNCOVERED:
            cells.append(f"**none reaches the changed lines on a CPU**: {UNCOVERED[patch]}")
        lines.append(f"| {patch} | {'; '.join(cells)} |")
    return "\n".join(lines)
