# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Rank worker: ds_gas_check's engine on many configs in one launch, plus negative controls.

Against the fork the installed ``deepspeed.gafix.gas_check`` runs; against pristine upstream the
checker (which uses public DeepSpeed APIs only) is loaded from this repository as a standalone tool.
"""

import atexit
import importlib
import os
import shutil
import tempfile

import torch

from deepspeed.runtime.engine import DeepSpeedEngine
from helpers.checker_module import gas_check as checker_package
from helpers.rank_cases import force_fp16_on_cpu, run_cases
from helpers.repo import load_script

gas_check = checker_package()  # on pristine upstream, the repository's copy

TORCH_LINEAR = torch.nn.functional.linear  # before any ZeRO-3 engine replaces it (zero_init below)
NO_CLIP = {"gradient_clipping": 0.0}
SGD = {"optimizer": {"type": "SGD", "params": {"lr": 0.1}}}
ADAMW = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.0, "torch_adam": True}}}
# DeepSpeed's FusedAdam: with fp16 and no ZeRO it selects FP16_Optimizer (flat fp32 master weights).
FUSED_ADAM = {"optimizer": {"type": "Adam", "params": {"lr": 1e-3}}}


def zero(stage, **extra):
    return {"zero_optimization": {"stage": stage}, **extra}


def check(config, **kwargs):
    return [
        dict(vars(r), name=r.name, passed=r.passed, verdict=r.verdict)
        for r in gas_check.check_gas_invariance(config, **kwargs)
    ]


def with_backward(wrapper, config, run=check, **kwargs):
    """``run`` a check (default: ``check``'s rows) while every engine.backward() goes through ``wrapper`` (a
    caller's own loss handling)."""
    original = DeepSpeedEngine.backward
    DeepSpeedEngine.backward = lambda engine, loss, **kw: wrapper(original, engine, loss)
    try:
        return run(config, **kwargs)
    finally:
        DeepSpeedEngine.backward = original


def forgets_to_divide(original, engine, loss):
    # scale_wrt_gas=False and no division by GAS: micro-batch gradients get summed.
    return original(engine, loss, scale_wrt_gas=False)


def divides_itself(original, engine, loss):
    # engine.backward(loss, scale_wrt_gas=False) with the caller dividing by GAS: right.
    return original(engine, loss / engine.gradient_accumulation_steps(), scale_wrt_gas=False)


def multiplies_by_world(original, engine, loss):
    import deepspeed.comm as dist
    return original(engine, loss * dist.get_world_size())


def drops_last_micro_batch(original, engine, loss):
    # The last micro-batch of each step adds nothing (at GAS 1: the step's only one).
    return original(engine, loss * 0.0 if engine.is_gradient_accumulation_boundary() else loss)


def drops_last_accumulated_micro_batch(original, engine, loss):
    # Under gradient accumulation only (GAS > 1), the last micro-batch of each step adds nothing.
    dropped = engine.gradient_accumulation_steps() > 1 and engine.is_gradient_accumulation_boundary()
    return original(engine, loss * 0.0 if dropped else loss)


def scales_by_0_7349(original, engine, loss):
    # A constant factor that is no known mistake (on an H100 one read as "(GAS-1)/GAS" at GAS 4).
    return original(engine, loss * 0.7349)


FP16_STATIC = {"fp16": {"enabled": True, "loss_scale": 256}}
FP16_DYNAMIC = {"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 10}}
BF16 = {"bf16": {"enabled": True}}
# bf16 + ZeRO-1 + fp32 gradient accumulation selects BF16_Optimizer.
BF16_FP32_ACCUM = {"data_types": {"grad_accum_dtype": "fp32"}}
# The fp32 master weights and the optimizer on the CPU, with a torch optimizer (no CPU Adam build).
OFFLOAD = {"offload_optimizer": {"device": "cpu"}}
TORCH_OPTIMIZER_OFFLOAD = {"zero_force_ds_cpu_optimizer": False}


def zero_offload(stage, **extra):
    return {"zero_optimization": {"stage": stage, **OFFLOAD}, **TORCH_OPTIMIZER_OFFLOAD, **extra}


CONFIGS = {
    "zero0_fp32":
    zero(0, **NO_CLIP, **SGD),
    "zero1_fp32":
    zero(1, **NO_CLIP, **SGD),
    "zero2_fp32":
    zero(2, **NO_CLIP, **SGD),
    "zero3_fp32":
    zero(3, **NO_CLIP, **SGD),
    "zero1_fp32_clip":
    zero(1, gradient_clipping=0.5, **SGD),
    "zero2_fp32_adamw_clip":
    zero(2, gradient_clipping=0.5, **ADAMW),
    # torch's AdamW (torch_adam) without weight_decay in the config: the engine's optimizer decays by torch's
    # default, 0.01 (the check's reference once assumed DeepSpeed's Adam default, 0, and failed it by 1e-3).
    "zero2_fp32_torch_adamw_default_decay":
    zero(2, **NO_CLIP, optimizer={
        "type": "AdamW",
        "params": {
            "lr": 1e-3,
            "torch_adam": True
        }
    }),
    "zero1_bf16":
    zero(1, **NO_CLIP, **SGD, **BF16),
    "zero2_bf16_clip":
    zero(2, gradient_clipping=0.5, **SGD, **BF16),
    "zero0_fp16_static":
    zero(0, **NO_CLIP, **SGD, **FP16_STATIC),
    # fp16 without ZeRO: FP16_Optimizer (FusedAdam), FP16_UnfusedOptimizer (torch's AdamW).
    "zero0_fp16_fused_adam_clip":
    zero(0, gradient_clipping=0.5, **FUSED_ADAM, **FP16_STATIC),
    # Adam turns fp16's rounding of a near-zero gradient into a full-size step (1 rank, GAS 4 and 8).
    "zero0_fp16_adamw_clip":
    zero(0, gradient_clipping=0.5, **ADAMW, **FP16_STATIC),
    "zero0_fp16_adamw_weight_decay":
    zero(0,
         **NO_CLIP,
         optimizer={
             "type": "AdamW",
             "params": {
                 "lr": 1e-3,
                 "weight_decay": 0.1,
                 "torch_adam": True
             }
         },
         **FP16_STATIC),
    "zero2_fp16_dynamic":
    zero(2, **NO_CLIP, **SGD, **FP16_DYNAMIC),
    "zero0_bf16":
    zero(0, **NO_CLIP, **SGD, **BF16),
    "zero1_bf16_fp32_accum":
    zero(1, **NO_CLIP, **SGD, **BF16_FP32_ACCUM, bf16={
        "enabled": True,
        "immediate_grad_update": False
    }),
    "zero1_bf16_fp32_accum_immediate":
    zero(1, **NO_CLIP, **SGD, **BF16_FP32_ACCUM, bf16={
        "enabled": True,
        "immediate_grad_update": True
    }),
    "zero1_offload_fp32":
    zero_offload(1, **NO_CLIP, **SGD),
    "zero2_offload_bf16_clip":
    zero_offload(2, gradient_clipping=0.5, **SGD, **BF16),
    "zero3_offload_fp32":
    zero_offload(3, **NO_CLIP, **SGD),
    # Clipping makes the optimizers scale the host-side fp32 gradients by the norm: on a GPU that
    # norm must come back to the host (tests/test_cuda_engines.py).
    "zero1_offload_fp32_clip":
    zero_offload(1, gradient_clipping=0.5, **SGD),
    "zero3_offload_bf16_clip":
    zero_offload(3, gradient_clipping=0.5, **SGD, **BF16),
}
MUON = {"optimizer": {"type": "Muon", "params": {"lr": 0.02, "momentum": 0.95}}}
ADAGRAD = {"optimizer": {"type": "Adagrad", "params": {"lr": 0.01}}}
LION = {"optimizer": {"type": "Lion", "params": {"lr": 1e-4, "betas": [0.9, 0.99]}}}


def zero_muon(stage, **extra):
    """Muon under ZeRO: Newton-Schulz needs each matrix's whole reduced gradient, so no reduce-scatter."""
    config = zero(stage, gradient_clipping=0.5, **MUON, **extra)
    config["zero_optimization"]["reduce_scatter"] = False
    return config


# The optimizers beside SGD and Adam (ds_gas_check --optimizer muon, adagrad, lion), clipping active. 0.19.8
# clips Muon's orthogonalized update, not its gradient (patch Clip-Muon-s-gradient-not-its-orthogonalized-update-u).
CONFIGS.update({
    "zero1_fp32_muon_clip": zero_muon(1),
    "zero3_fp32_muon_clip": zero_muon(3),
    "zero2_offload_fp32_muon_clip": zero_muon(2, zero_optimization={
        "stage": 2,
        **OFFLOAD
    }),
    "zero2_bf16_muon_clip": zero_muon(2, **BF16),
    "zero2_offload_fp32_adagrad_clip": zero_offload(2, gradient_clipping=0.5, **ADAGRAD),
    "zero2_offload_fp32_lion_clip": zero_offload(2, gradient_clipping=0.5, **LION),
})


def zero_with(stage, zero_keys, **extra):
    """ZeRO ``stage`` with ``zero_keys`` inside "zero_optimization" (zero() puts its keywords at the top level)."""
    return {"zero_optimization": {"stage": stage, **zero_keys}, **extra}


# The engine's other ways to reduce, fetch and place (docs/reference/engine_surface.md): each right at every split.
# round_robin_gradients failed here on 0.19.8 through its fp32 fragment mapping (patch
# Map-each-round-robin-ordered-parameter-to-its-own-fp).
CLIPPED_SGD = dict(SGD, gradient_clipping=0.5)
CONFIGS.update({
    "zero1_fp32_round_robin":
    zero_with(1, {"round_robin_gradients": True}, **CLIPPED_SGD),
    "zero2_fp32_round_robin":
    zero_with(2, {"round_robin_gradients": True}, **CLIPPED_SGD),
    "zero2_fp32_overlap_comm":
    zero_with(2, {"overlap_comm": True}, **CLIPPED_SGD),
    "zero2_fp32_no_contiguous_gradients":
    zero_with(2, {"contiguous_gradients": False}, **CLIPPED_SGD),
    "zero2_fp32_single_rank_buckets":
    zero_with(2, {"use_multi_rank_bucket_allreduce": False}, **CLIPPED_SGD),
    "zero2_fp32_no_allgather_partitions":
    zero_with(2, {"allgather_partitions": False}, **CLIPPED_SGD),
    "zero2_fp32_disable_allgather":
    zero_with(2, {}, disable_allgather=True, **CLIPPED_SGD),
    "zero3_fp32_no_overlap_no_contiguous":
    zero_with(3, {
        "overlap_comm": False,
        "contiguous_gradients": False
    }, **SGD),
    "zero3_fp32_fetch_one_at_a_time":
    zero_with(3, {
        "stage3_max_live_parameters": 10,
        "stage3_max_reuse_distance": 0,
        "stage3_prefetch_bucket_size": 10
    }, **SGD),
    "zero3_offload_param_fp32":
    zero_with(3, {
        **OFFLOAD, "offload_param": {
            "device": "cpu"
        }
    }, **TORCH_OPTIMIZER_OFFLOAD, **CLIPPED_SGD),
    "zero2_bf16_fp32_communication":
    zero_with(2, {}, communication_data_type="fp32", **BF16, **CLIPPED_SGD),
})

# The deprecated ZeRO aliases of offload (cpu_offload for the optimizer's, cpu_offload_param and
# cpu_offload_use_pin_memory for the parameters'), and ZeRO-1/2's parameter alignment, which pads the flat buffers
# between parameters (bf16: to 8 elements, so the 4-element bias is padded).
CONFIGS.update({
    "zero2_fp32_cpu_offload_alias":
    zero_with(2, {"cpu_offload": True}, **TORCH_OPTIMIZER_OFFLOAD, **CLIPPED_SGD),
    "zero3_fp32_cpu_offload_aliases":
    zero_with(3, {
        "cpu_offload": True,
        "cpu_offload_param": True,
        "cpu_offload_use_pin_memory": True
    }, **TORCH_OPTIMIZER_OFFLOAD, **CLIPPED_SGD),
    "zero2_bf16_parameter_alignment":
    zero_with(2, {"parameter_alignment": True}, **BF16, **CLIPPED_SGD),
})

# ZeRO-Infinity: ZeRO-3 with its optimizer states and parameters swapped to NVMe (here a plain directory, one per
# rank), reads and writes pipelined, clipping active; needs DeepSpeed's async_io op (libaio), which
# tests/test_gas_check.py checks.
NVME_PATH = os.path.join(tempfile.gettempdir(), f"ds_gas_check_nvme_{os.getpid()}")
atexit.register(shutil.rmtree, NVME_PATH, ignore_errors=True)
NVME_OPTIMIZER = {"device": "nvme", "nvme_path": NVME_PATH, "pipeline_read": True, "pipeline_write": True}
CONFIGS["zero3_nvme_offload_fp32"] = zero_with(3, {
    "offload_optimizer": NVME_OPTIMIZER,
    "offload_param": {
        "device": "nvme",
        "nvme_path": NVME_PATH
    }
},
                                               gradient_clipping=0.5,
                                               **FUSED_ADAM)  # DeepSpeed's CPU Adam, whose states the swapper moves

# More of the engine's surface (docs/reference/engine_surface.md): the norm left uncomputed (ZeRO-1/2, no clipping),
# hpZ's secondary weight partitions, ZeRO-3's other ways to fetch parameters, torch autocast (the check reads its
# dtype: its rounding is bf16's, not fp32's) and learning-rate schedules (the reference steps the same schedule once
# per step, so an engine stepping it per micro-batch fails at GAS > 1).
WARMUP_LR = {"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.1, "warmup_num_steps": 3}}}
CONFIGS.update({
    "zero1_fp32_no_grad_norm":
    zero_with(1, {"compute_grad_norm": False}, **NO_CLIP, **SGD),
    "zero2_fp32_no_grad_norm":
    zero_with(2, {"compute_grad_norm": False}, **NO_CLIP, **SGD),
    "zero3_fp32_hpz":
    zero_with(3, {"zero_hpz_partition_size": 2}, **CLIPPED_SGD),
    "zero3_fp32_fetch_by_all_reduce":
    zero_with(
        3, {
            "stage3_model_persistence_threshold": 0,
            "stage3_param_persistence_threshold": 0,
            "stage3_use_all_reduce_for_fetch_params": True,
            "stage3_module_granularity_threshold": 1
        }, **CLIPPED_SGD),
    "zero3_fp32_allgather_sequential":
    zero_with(3, {"stage3_allgather_sequential": True}, **CLIPPED_SGD),
    "zero0_autocast_bf16":
    zero_with(0, {}, torch_autocast={
        "enabled": True,
        "dtype": "bfloat16"
    }, **CLIPPED_SGD),
    "zero2_autocast_bf16":
    zero_with(2, {}, torch_autocast={
        "enabled": True,
        "dtype": "bfloat16"
    }, **CLIPPED_SGD),
    "zero2_fp32_warmup_lr":
    dict(zero(2), **WARMUP_LR, **CLIPPED_SGD),
    "zero3_offload_fp32_warmup_lr":
    dict(zero_offload(3), **WARMUP_LR, **CLIPPED_SGD),
    "zero1_bf16_warmup_decay_lr":
    dict(zero(1),
         scheduler={
             "type": "WarmupDecayLR",
             "params": {
                 "total_num_steps": 3,
                 "warmup_max_lr": 0.1,
                 "warmup_num_steps": 1
             }
         },
         **BF16,
         **CLIPPED_SGD),
    "zero0_fp16_one_cycle":
    dict(zero(0),
         scheduler={
             "type": "OneCycle",
             "params": {
                 "cycle_min_lr": 0.01,
                 "cycle_max_lr": 0.1,
                 "cycle_first_step_size": 2
             }
         },
         fp16={
             "enabled": True,
             "initial_scale_power": 8
         },
         **CLIPPED_SGD),
    "zero2_fp32_torch_cosine_lr":
    dict(zero(2), scheduler={
        "type": "CosineAnnealingLR",
        "params": {
            "T_max": 3
        }
    }, **CLIPPED_SGD),
    "zero0_fp32_torch_step_lr":
    dict(zero(0), scheduler={
        "type": "StepLR",
        "params": {
            "step_size": 1,
            "gamma": 0.5
        }
    }, **CLIPPED_SGD),
})

# Master weights, their gradients and Adam's states kept in bf16: an Adam step under half a weight's last bit is
# lost (update error 2.1e-01 against fp64 at every split, GAS 1 included), so the check's plain-PyTorch run keeps
# them in bf16 too. With DeepSpeed's FusedAdam (fp32 arithmetic, as the check's run) and with SGD (ZeRO-3).
BF16_MASTER = {"bf16": {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}}
CONFIGS.update({
    "zero1_bf16_master_adam_clip": zero(1, gradient_clipping=1.0, **FUSED_ADAM, **BF16_MASTER),
    "zero3_bf16_master_sgd_clip": zero(3, **CLIPPED_SGD, **BF16_MASTER),
})

# Mixed-precision settings (docs/reference/engine_surface.md): autocast lowering no module's gradients (every
# reduction in fp32, where the default list reduces the Linear layers' in bf16), fp16's auto_cast (the inputs cast to
# fp16), bf16 without its overflow check, and fp16 master weights and gradients (ZeRO-2 offload with DeepSpeed's CPU
# Adam, as the engine requires).
CONFIGS.update({
    "zero2_autocast_bf16_no_lowered_modules":
    zero_with(2, {},
              torch_autocast={
                  "enabled": True,
                  "dtype": "bfloat16",
                  "lower_precision_safe_modules": []
              },
              **CLIPPED_SGD),
    "zero2_fp16_auto_cast":
    zero(2, **CLIPPED_SGD, fp16={
        "enabled": True,
        "loss_scale": 0,
        "initial_scale_power": 10,
        "auto_cast": True
    }),
    "zero2_bf16_no_overflow_check_clip":
    zero(2, **CLIPPED_SGD, bf16={
        "enabled": True,
        "check_grad_overflow": False
    }),
    "zero2_offload_fp16_master_adam_clip":
    zero_with(2,
              OFFLOAD,
              gradient_clipping=0.5,
              fp16={
                  "enabled": True,
                  "initial_scale_power": 8,
                  "fp16_master_weights_and_grads": True
              },
              **FUSED_ADAM),
})

# ZeRO-3's optimizer offload in more shapes: NVMe with more swap buffers than the default and fast initialisation,
# a partial offload (half the sub-groups stepped on the CPU by DeepSpeed's CPU Adam, the rest by the device's Adam:
# small buckets give the model several sub-groups), and Muon with its momentum kept in memory under NVMe offload.
CONFIGS.update({
    "zero3_nvme_offload_fp32_buffers":
    zero_with(
        3,
        {
            "offload_optimizer": dict(NVME_OPTIMIZER, buffer_count=5, fast_init=True),
            "offload_param": {
                "device": "nvme",
                "nvme_path": NVME_PATH,
                "buffer_count": 6,
                "buffer_size": 100_000  # elements: 6 of the default 1e8 fill the memory of 2 ranks on a small host
            }
        },
        gradient_clipping=0.5,
        **FUSED_ADAM),
    "zero3_nvme_offload_muon_momentum_in_memory":
    zero_muon(3,
              zero_optimization={
                  "stage": 3,
                  "offload_optimizer": NVME_OPTIMIZER,
                  "save_muon_momentum_buffer_in_memory": True
              }),
})

# RLHF's hybrid engine (DeepSpeedHybridEngine, the engine class for "hybrid_engine": {"enabled": true}): its training
# steps, ZeRO-3 as DeepSpeed-Chat trains the actor, and ZeRO-2 in bf16.
HYBRID_ENGINE = {"hybrid_engine": {"enabled": True}}
CONFIGS.update({
    "zero3_fp32_hybrid_engine_clip": zero_with(3, {}, **HYBRID_ENGINE, **CLIPPED_SGD),
    "zero2_bf16_hybrid_engine_clip": zero_with(2, {}, **HYBRID_ENGINE, **BF16, **CLIPPED_SGD),
})

# ZeRO++'s quantized gradients (qgZ) quantize only between nodes: on one node ZeRO-3 reduce-scatters them whole.
CONFIGS["zero3_fp32_qgz_one_node_clip"] = zero_with(3, {"zero_quantized_gradients": True}, **CLIPPED_SGD)

CASES = {name: (lambda config=config: check(config)) for name, config in CONFIGS.items()}


def doubles_later_buckets():
    """A seeded bucket bug: every gradient bucket ZeRO-1/2 reduces in a backward after its first is doubled.
    With DeepSpeed's default bucket size the built-in model is one bucket, so the default check cannot see it;
    with --small-buckets it spans several."""
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer as Zero
    average, epilogue = Zero.average_tensor, Zero.independent_gradient_partition_epilogue

    def seeded_average(self, tensor, *args, **kwargs):
        self.seeded_buckets = getattr(self, "seeded_buckets", 0) + 1
        if self.seeded_buckets > 1:
            tensor.mul_(2)
        return average(self, tensor, *args, **kwargs)

    def counted_epilogue(self, *args, **kwargs):
        try:
            return epilogue(self, *args, **kwargs)
        finally:
            self.seeded_buckets = 0

    Zero.average_tensor, Zero.independent_gradient_partition_epilogue = seeded_average, counted_epilogue
    try:
        return {
            "default": check(CONFIGS["zero2_fp32"]),
            "small_buckets": check(CONFIGS["zero2_fp32"], small_buckets=True)
        }
    finally:
        Zero.average_tensor, Zero.independent_gradient_partition_epilogue = average, epilogue


CASES["control_bucket_bug_needs_small_buckets"] = doubles_later_buckets


def inf_gradient_in_step_2():
    """One rank's loss turns inf in step 2 of 3: the engine skips that step on every split, and the check says so
    (a skipped step's update is zero, so the split fails against the reference)."""

    import deepspeed.comm as dist
    format_results = importlib.import_module(gas_check.__name__ + ".check").format_results

    def poisons_step_2(original, engine, loss):
        if dist.get_rank() == 1 and engine.global_steps == 1:
            loss = loss * float("inf")
        return original(engine, loss)

    results = with_backward(poisons_step_2, CONFIGS["zero1_fp32"], run=gas_check.check_gas_invariance)
    return {"skipped": [r.skipped_steps for r in results], "report": format_results(results, "inf in step 2")}


CASES["control_inf_gradient_in_step_2"] = inf_gradient_in_step_2


def comparison_collectives():
    """How many collectives the comparison itself makes (the engine's own not counted): with the reference, one per
    split; without it, one per split and one more for each split compared with the first (are their initial
    weights the same object's?)."""
    comparison = importlib.import_module(gas_check.__name__ + ".comparison")
    original, calls = comparison.sum_over_ranks, []
    comparison.sum_over_ranks = lambda values: calls.append(len(values)) or original(values)
    try:
        splits = len(check(CONFIGS["zero1_fp32"]))
        with_reference = len(calls)
        calls.clear()
        check(CONFIGS["zero1_fp32"], reference=False)
        return {"splits": splits, "with_reference": with_reference, "without_reference": len(calls)}
    finally:
        comparison.sum_over_ranks = original


CASES["comparison_collectives"] = comparison_collectives
CASES["zero3_offload_fp32_partial_ratio"] = lambda: check(zero_with(
    3, {"offload_optimizer": {
        "device": "cpu",
        "ratio": 0.5
    }}, gradient_clipping=0.5, **FUSED_ADAM),
                                                          small_buckets=True)
CASES["zero2_fp32_small_buckets"] = lambda: check(zero(2, gradient_clipping=0.5, **SGD), small_buckets=True)
CASES["zero3_fp32_small_buckets"] = lambda: check(zero(3, gradient_clipping=0.5, **SGD), small_buckets=True)


def zero_init(config, **kwargs):
    """ZeRO-3 with the model built under deepspeed.zero.Init, as transformers builds one for ZeRO-3. With
    memory_efficient_linear (the default) zero.Init, and every ZeRO-3 engine, puts ZeRO-3's own linear function in
    place of torch's for the rest of the process: the case starts from torch's, checks which one trained, and leaves
    what it found for the cases after it."""
    from deepspeed.runtime.zero.linear import zero3_linear_wrap
    found, torch.nn.functional.linear = torch.nn.functional.linear, TORCH_LINEAR
    try:
        rows = check(config, zero_init=True, **kwargs)
        zero3_linear = torch.nn.functional.linear is zero3_linear_wrap
    finally:
        torch.nn.functional.linear = found
    if zero3_linear != config["zero_optimization"].get("memory_efficient_linear", True):
        raise RuntimeError(f"memory_efficient_linear {config['zero_optimization']}: ZeRO-3's linear "
                           f"{'trained' if zero3_linear else 'did not train'}")
    return rows


def initialised_by_apply():
    """The built-in model, its linear layers' weights initialised again through ``Module.apply`` once built (as
    transformers initialises weights a checkpoint lacks): under zero.Init the weights are partitioned by then, and
    zero.Init gathers them for ``apply`` (``override_module_apply``, the default). 0.19.8's apply returned None
    there (patch Return-the-module-from-Module.apply-under-zero.Init)."""

    def init_weights(module):
        if isinstance(module, torch.nn.Linear):
            torch.nn.init.normal_(module.weight, std=0.3)

    return gas_check.models.builtin_model().apply(init_weights)


# Its linear layers through ZeRO-3's linear function (small buckets: several fetches) or torch's; a model initialised
# through Module.apply; Muon, whose matrices the check knows by their layer's shape (a zero.Init parameter is 1-D).
CASES["zero3_fp32_zero_init_module_apply_clip"] = lambda: zero_init(zero(3, **CLIPPED_SGD),
                                                                    make_model=initialised_by_apply)
CASES["zero3_fp32_zero_init_clip"] = lambda: zero_init(zero(3, **CLIPPED_SGD), small_buckets=True)
CASES["zero3_fp32_zero_init_muon_clip"] = lambda: zero_init(zero_muon(3))
CASES["zero3_bf16_zero_init_torch_linear_clip"] = lambda: zero_init(
    zero_with(3, {"memory_efficient_linear": False}, **BF16, **CLIPPED_SGD))


def compiled(config, **kwargs):
    """The engine compiled (``engine.compile()``: torch.compile of the model with the accelerator's backend, inductor
    on a CPU) before it trains, as a script that calls it does; fails unless torch.compile compiled a frame of the
    model (the built-in model has a forward of its own for it)."""
    from torch._dynamo.convert_frame import FRAME_COMPILE_COUNTER
    before = sum(FRAME_COMPILE_COUNTER.values())
    rows = check(config, compiled=True, **kwargs)
    if sum(FRAME_COMPILE_COUNTER.values()) == before:
        raise RuntimeError("engine.compile(): torch.compile compiled no frame; the check ran eager")
    return rows


# ZeRO's gradient hooks (ZeRO-3's parameter fetches too) on a compiled module.
CASES["zero1_fp32_compiled_clip"] = lambda: compiled(zero(1, **CLIPPED_SGD))
CASES["zero2_bf16_compiled_clip"] = lambda: compiled(zero(2, **BF16, **CLIPPED_SGD))
CASES["zero3_fp32_compiled_clip"] = lambda: compiled(zero(3, **CLIPPED_SGD), small_buckets=True)
CASES["zero0_fp16_compiled"] = lambda: compiled(zero(0, **NO_CLIP, **SGD, **FP16_DYNAMIC))
CASES["zero2_fp32_caller_divides"] = lambda: with_backward(divides_itself, CONFIGS["zero2_fp32"])
CASES["zero1_fp32_boundary_loop"] = lambda: check(CONFIGS["zero1_fp32"], loop="boundary")
CASES["zero3_bf16_boundary_loop"] = lambda: check(zero(3, **NO_CLIP, **SGD, **BF16), loop="boundary")
CASES["zero1_fp32_allreduce_sum"] = lambda: check(zero(1, gradient_allreduce_op="sum", **NO_CLIP, **SGD))
CASES["zero2_bf16_allreduce_sum_clip"] = lambda: check(
    zero(2, gradient_allreduce_op="sum", gradient_clipping=0.5, **SGD, **BF16))
CASES["zero0_fp32_unmanaged"] = lambda: check(zero(0, managed_gradient_accumulation=False, **NO_CLIP, **SGD),
                                              loop="step_once")
CASES["zero2_fp32_unmanaged"] = lambda: check(zero(2, managed_gradient_accumulation=False, **NO_CLIP, **SGD),
                                              loop="step_once")
# The dynamic loss scale grows after every loss_scale_window overflow-free steps: here after each step.
FP16_GROWING = {"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 4, "loss_scale_window": 1}}
for stage in range(4):
    CASES[f"zero{stage}_fp16_scale_growth"] = lambda stage=stage: check(zero(stage, **NO_CLIP, **SGD, **FP16_GROWING))
CASES["control_forgets_to_divide"] = lambda: with_backward(forgets_to_divide, CONFIGS["zero1_fp32"])
# The same mistake where bf16 master weights round Adam's steps: still no split passes.
CASES["control_bf16_master_drops_micro_batch"] = lambda: with_backward(drops_last_accumulated_micro_batch, CONFIGS[
    "zero1_bf16_master_adam_clip"])
CASES["control_bf16_master_sgd_forgets_to_divide"] = lambda: with_backward(forgets_to_divide, CONFIGS[
    "zero3_bf16_master_sgd_clip"])
CASES["control_multiplies_by_world"] = lambda: with_backward(multiplies_by_world, CONFIGS["zero1_fp32"])
CASES["control_constant_factor"] = lambda: with_backward(scales_by_0_7349, CONFIGS["zero1_fp32"])
CASES["control_fp16_adamw_drops_micro_batch"] = lambda: with_backward(drops_last_micro_batch, CONFIGS[
    "zero0_fp16_adamw_clip"])
CASES["zero1_fp32_no_reference"] = lambda: check(CONFIGS["zero1_fp32"], reference=False)
# --items variable: samples of 0-12 labelled positions. per_item mode against the fp64 global item mean
# (ZeRO-2 bf16 clipped: the one-collective norm, its count and the bf16 tolerance); mean mode passes
# against its own contract and reports how far each split's micro-batch means are from the item mean.
PER_ITEM = {"loss_normalization": "per_item"}
CASES["zero2_bf16_clip_per_item_variable_items"] = lambda: check(
    zero(2, gradient_clipping=0.5, **PER_ITEM, **SGD, **BF16), items="variable")
CASES["zero3_fp32_per_item_variable_items"] = lambda: check(zero(3, **NO_CLIP, **PER_ITEM, **SGD), items="variable")
CASES["zero1_fp32_mean_variable_items"] = lambda: check(zero(1, **NO_CLIP, **SGD), items="variable")
# Without a reference, on the same data: each split against its own micro-batches without accumulation (a
# correct engine passes, no bf16 cause is named), and a micro-batch dropped under accumulation still fails.
CASES["zero3_fp32_variable_items_no_reference"] = lambda: check(
    zero(3, gradient_clipping=0.5, **SGD), items="variable", reference=False)
CASES["zero2_bf16_variable_items_no_reference"] = lambda: check(
    zero(2, gradient_clipping=0.5, **SGD, **BF16), items="variable", reference=False)
CASES["control_drops_micro_batch_no_reference"] = lambda: with_backward(
    drops_last_accumulated_micro_batch, zero(3, gradient_clipping=0.5, **SGD), items="variable", reference=False)
# Without a ZeRO optimizer (patch Add-per-item-loss-normalization-to-ZeRO-0-BF16_Optim): the count's own all-reduce,
# divided in the engine's.
CASES["zero0_fp32_clip_per_item_variable_items"] = lambda: check(zero(0, gradient_clipping=0.5, **PER_ITEM, **SGD),
                                                                 items="variable")
CASES["zero1_bf16_fp32_accum_per_item_variable_items"] = lambda: check(
    zero(1, **NO_CLIP, **PER_ITEM, **SGD, **BF16_FP32_ACCUM, bf16={"enabled": True}), items="variable")


class LeafBlock(torch.nn.Module):
    """Two layers ZeRO-3 fetches and reduces as one (``zero_optimization.leaf_module``), as it does an MoE block."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(8, 32)
        self.down = torch.nn.Linear(32, 32)

    def forward(self, x):
        return torch.tanh(self.down(torch.tanh(self.up(x))))


def leaf_block_model():
    # The block after a layer: its input requires grad, as in a transformer (DeepSpeed does not support a leaf module
    # whose inputs do not: its backward never fetches the block's parameters).
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), LeafBlock(), torch.nn.Linear(32, 4))


# ZeRO-3 leaf modules: the block's gradients reduce-scattered at its exit, not per parameter; small buckets so that
# the model spans several.
CASES["zero3_fp32_leaf_module_small_buckets"] = lambda: check(
    {
        "zero_optimization": {
            "stage": 3,
            "leaf_module": {
                "classes": ["LeafBlock"]
            }
        },
        "gradient_clipping": 0.5,
        **SGD
    },
    make_model=leaf_block_model,
    small_buckets=True)


def user_pipeline_transformer():
    """examples/gas_check_transformer.py's PipelineModule and token batches, as --model/--data give them."""
    example = load_script("examples/gas_check_transformer.py")
    return check(dict(gradient_clipping=0.2, **SGD),
                 make_model=example.make_pipeline,
                 pipeline_stages=2,
                 data=example.make_pipeline_batches,
                 splits=((4, 1), (2, 2), (1, 4)),
                 steps=2)


def sequence_parallel(size, loss="share"):
    return importlib.import_module(gas_check.__name__ + ".sequence").SequenceParallel(size, loss)


def mislabelled_sequence_parallel_loss():
    """Negative control: every SP rank backpropagates the gathered loss while the engine is told each writes its share,
    so the engine adds gradients it should average: every split's gradient is SP (2) times fp64's."""
    sequence = importlib.import_module(gas_check.__name__ + ".sequence")

    class Mislabelled(sequence.SequenceParallel):

        def backpropagated(self, loss):
            return sequence.SequenceParallel(self.size, "gathered").backpropagated(loss)

    return check(zero(2, **NO_CLIP, **SGD), splits=SP_SPLITS, sequence=Mislabelled(2, "share"))


# Ulysses sequence parallelism, 2 ranks per sequence (with 2 ranks: data parallel 1; with 4: 2), before the pipeline
# cases. 0.19.8's ZeRO-3 reduce-scatter halves the share loss's gradient (upstream #5248).
SP_SPLITS = ((8, 1), (4, 2))
CASES["zero3_fp32_sp2_clip"] = lambda: check(zero(3, **CLIPPED_SGD), splits=SP_SPLITS, sequence=sequence_parallel(2))
CASES["zero3_fp32_sp2_gathered_clip"] = lambda: check(
    zero(3, **CLIPPED_SGD), splits=SP_SPLITS, sequence=sequence_parallel(2, "gathered"))
CASES["zero1_bf16_sp2_gathered"] = lambda: check(
    zero(1, **NO_CLIP, **SGD, **BF16), splits=SP_SPLITS, sequence=sequence_parallel(2, "gathered"))
# Under sequence parallelism the engine reduces gradients in seq_parallel_communication_data_type.
SP_COMM_BF16 = zero(2, seq_parallel_communication_data_type="bf16", **CLIPPED_SGD, **BF16)
CASES["zero2_bf16_sp2_gathered_comm_bf16"] = lambda: check(
    SP_COMM_BF16, splits=SP_SPLITS, sequence=sequence_parallel(2, "gathered"))
CASES["control_sp2_gathered_loss_declared_as_share"] = mislabelled_sequence_parallel_loss

# Last: the pipeline grid stays in deepspeed.utils.groups for the rest of the process.
CASES["pipe2_fp32"] = lambda: check(dict(**NO_CLIP, **SGD), pipeline_stages=2)
CASES["pipe2_fp32_clip"] = lambda: check(dict(gradient_clipping=0.5, **SGD), pipeline_stages=2)
CASES["pipe2_bf16"] = lambda: check(dict(**NO_CLIP, **SGD, **BF16), pipeline_stages=2)
CASES["pipe2_user_transformer_clip"] = user_pipeline_transformer
# The pipeline section's activation checkpointing: every layer recomputed in the backward, reentrant and not.
CASES["pipe2_fp32_checkpointed_clip"] = lambda: check(
    dict(gradient_clipping=0.5, pipeline={"activation_checkpoint_interval": 1}, **SGD), pipeline_stages=2)
CASES["pipe2_fp32_non_reentrant_checkpointed_clip"] = lambda: check(dict(
    gradient_clipping=0.5, pipeline={
        "activation_checkpoint_interval": 1,
        "use_reentrant": False
    }, **SGD),
                                                                    pipeline_stages=2)
CASES["pipe2_zero1_fp32_clip_per_item_variable_items"] = lambda: check(
    zero(1, gradient_clipping=0.5, **PER_ITEM, **SGD), pipeline_stages=2, items="variable")
CASES["pipe2_bf16_per_item_variable_items"] = lambda: check(
    dict(**NO_CLIP, **PER_ITEM, **SGD, **BF16), pipeline_stages=2, items="variable")

if __name__ == "__main__":
    force_fp16_on_cpu()
    run_cases(CASES)
