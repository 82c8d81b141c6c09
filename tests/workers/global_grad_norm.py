# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Rank worker: the global grad norm per engine path: its value and how many all-reduces it costs.

Every data-parallel case trains one global batch (2 ranks x micro-batch 2 x GAS 2) of a model whose
parameters sit in TWO optimizer groups (weights, biases), counts the all-reduce calls made inside
the boundary ``engine.step()`` (gradient reduction happens in backward, so what step() issues is the
norm and the overflow check) and compares ``engine.get_global_grad_norm()`` with fp64 PyTorch.
``pipeline_uneven_groups`` gives the two pipeline stages different numbers of groups (upstream
issues one collective per group there, so the stages wait on each other forever).
"""

import copy

import torch  # noqa: E402

import deepspeed  # noqa: E402
import deepspeed.comm as dist  # noqa: E402
from toolkit.collectives import CollectiveCounter, train_step_counting_collectives  # noqa: E402
from helpers.engine_paths import BF16, FP16, relative_update_error  # noqa: E402
from helpers.moe_model import MoENet, fp64_gradients, fp64_norm  # noqa: E402
from helpers.rank_cases import force_fp16_on_cpu, run_cases  # noqa: E402
from helpers.small_model import IN, OUT, global_batch, make_layers, micro_batches, mse, rank_share  # noqa: E402

MICRO, GAS = 2, 2


def reference_norm(layers, inputs, targets):
    model = torch.nn.Sequential(*copy.deepcopy(layers)).double()
    torch.nn.functional.mse_loss(model(inputs.double()), targets.double()).backward()
    return float(torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in model.parameters()])))


def two_groups(module):
    params = [p for p in module.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() > 1]}, {"params": [p for p in params if p.dim() <= 1]}]


def base_config(extra):
    config = {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": GAS,
        "optimizer": {
            "type": "SGD",
            "params": {
                "lr": 0.1
            }
        },
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "gradient_clipping": 1.0,
    }
    config.update(extra)
    return config


def norm_plan_builds(engine):
    """How many times the fused op built its plan's layout for the counted gradients of the optimizer
    (or of the engine, where the engine takes the norm itself); None where neither keeps one."""
    owner = next((o for o in (engine.optimizer, engine) if hasattr(o, "_grad_norm_plans")), None)
    return None if owner is None else owner._grad_norm_plans.counted.builds


def data_parallel_case(extra, per_item=False):
    """``per_item``: "loss_normalization": "per_item", each micro-batch's loss passed as a sum over its
    samples with their count (the same norm and update: every sample is one item)."""

    def backward(engine, loss, count):
        if per_item:
            engine.backward(loss * count, num_items=count)
        else:
            engine.backward(loss)

    def run():
        layers = make_layers()
        model = torch.nn.Sequential(*copy.deepcopy(layers))
        config = dict(base_config(extra), **({"loss_normalization": "per_item"} if per_item else {}))
        engine, *_ = deepspeed.initialize(model=model, model_parameters=two_groups(model), config=config)
        inputs, targets = global_batch(MICRO * GAS * dist.get_world_size())
        x, y = rank_share(inputs, targets, dist.get_rank(), MICRO * GAS)
        dtype = next(engine.module.parameters()).dtype
        counts, host_reads = [], 0
        for batch, target in micro_batches(x, y, MICRO, GAS):
            loss = mse(engine(batch.to(dtype)), target)
            with CollectiveCounter() as backward_counter:
                backward(engine, loss, len(batch))
            with CollectiveCounter() as counter:
                engine.step()
            counts.append(len(counter.calls))
            host_reads = counter.host_reads
        norm = engine.get_global_grad_norm()
        for _ in range(2):  # the same batch twice more: the norm's plan must outlive the step
            for batch, target in micro_batches(x, y, MICRO, GAS):
                backward(engine, mse(engine(batch.to(dtype)), target), len(batch))
                engine.step()
        engine.destroy()
        return {
            "collectives_in_boundary_step": counts[-1],
            "collectives_in_other_steps": counts[:-1],
            "host_reads_in_boundary_step": host_reads,
            "host_reads_in_boundary_backward": backward_counter.host_reads,
            "collectives_in_boundary_backward": len(backward_counter.calls),
            "norm_plan_builds": norm_plan_builds(engine),
            "parameters": len(list(model.parameters())),
            "optimizer": type(engine.optimizer).__name__,
            "norm": None if norm is None else float(norm),
            "reference_norm": reference_norm(layers, inputs, targets),
        }

    return run


def overflow_case(stage):
    """fp16 with a dynamic loss scale: rank 1's last micro-batch loss is inf, so the step must be
    skipped on every rank (weights unchanged, scale halved, the norm reported as inf), and the next
    global batch, all finite, applied with a finite norm."""

    def run():
        from deepspeed.utils import safe_get_full_fp32_param
        layers = make_layers()
        model = torch.nn.Sequential(*copy.deepcopy(layers))
        fp16 = {"fp16": {"enabled": True, "initial_scale_power": 8}, "zero_optimization": {"stage": stage}}
        engine, *_ = deepspeed.initialize(model=model, model_parameters=two_groups(model), config=base_config(fp16))
        inputs, targets = global_batch(MICRO * GAS * dist.get_world_size())
        x, y = rank_share(inputs, targets, dist.get_rank(), MICRO * GAS)

        def weights():
            return torch.cat([safe_get_full_fp32_param(p).flatten() for p in engine.module.parameters()])

        steps = []
        for poisoned in (True, False):
            before, scale = weights(), engine.optimizer.loss_scale
            for i, (batch, target) in enumerate(micro_batches(x, y, MICRO, GAS, torch.half)):
                loss = mse(engine(batch), target)
                if poisoned and i == GAS - 1 and dist.get_rank() == 1:
                    loss = loss * float("inf")
                engine.backward(loss)
                engine.step()
            steps.append({
                "weights_changed": not torch.equal(before, weights()),
                "scale": [float(scale), float(engine.optimizer.loss_scale)],
                "norm": float(engine.get_global_grad_norm()),
                "skipped_steps": engine.skipped_steps,
            })
        engine.destroy()
        return steps

    return run


def lamb_legacy_step():
    """FP16_UnfusedOptimizer's legacy LAMB step (fp16, "type": "Lamb", no ZeRO; FusedLamb is a CUDA op, so a
    stand-in that takes the same step arguments): a finite batch steps, an inf gradient (every rank's, as after the
    backward's all-reduce) is skipped."""
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer

    class LegacyLambStandIn(torch.optim.SGD):

        def step(self, closure=None, grads=None, output_params=None, scale=None):
            self.calls = getattr(self, "calls", 0) + 1
            self.scale = float(scale)

    model = torch.nn.Sequential(*make_layers()).half()
    lamb = LegacyLambStandIn(model.parameters(), lr=1e-3)
    optimizer = FP16_UnfusedOptimizer(lamb,
                                      dynamic_loss_scale=True,
                                      dynamic_loss_args=None,
                                      clip_grad=1.0,
                                      fused_lamb_legacy=True,
                                      verbose=False)
    steps = []
    for poisoned in (False, True):
        for p in model.parameters():
            p.grad = torch.full_like(p, float("inf") if poisoned else 0.01)
        overflow = optimizer.step()
        steps.append({"overflow": bool(overflow), "calls": getattr(lamb, "calls", 0)})
    return steps


def no_norm_case(extra):
    """``zero_optimization.compute_grad_norm: false`` with clipping off: step() takes no norm (no
    collective in fp32; in fp16 only the overflow flag's), ``get_global_grad_norm()`` is None as the
    option documents, and the update is plain SGD on the fp64 gradient."""

    def run():
        from deepspeed.utils import safe_get_full_fp32_param
        layers = make_layers()
        model = torch.nn.Sequential(*copy.deepcopy(layers))
        config = base_config(dict(extra, gradient_clipping=0.0))
        engine, *_ = deepspeed.initialize(model=model, model_parameters=two_groups(model), config=config)
        dtype = next(engine.module.parameters()).dtype

        def weights():
            return [safe_get_full_fp32_param(p).detach().double().clone() for p in engine.module.parameters()]

        inputs, targets = global_batch(MICRO * GAS * dist.get_world_size())
        inputs = inputs.to(dtype).float()  # what the engine sees
        before = weights()
        reference = torch.nn.Sequential(*copy.deepcopy(layers)).double()
        with torch.no_grad():
            for param, value in zip(reference.parameters(), before):
                param.copy_(value)
        torch.nn.functional.mse_loss(reference(inputs.double()), targets.double()).backward()
        x, y = rank_share(inputs, targets, dist.get_rank(), MICRO * GAS)
        losses = ((mse(engine(batch), target), {}) for batch, target in micro_batches(x, y, MICRO, GAS, dtype))
        step = train_step_counting_collectives(engine, losses)
        after = weights()
        engine.destroy()
        lr = config["optimizer"]["params"]["lr"]
        expected = [w - lr * p.grad for w, p in zip(before, reference.parameters())]
        return {
            **step,
            "update_error": relative_update_error(after, expected, before),
        }

    return run


class WithUnusedParameter(torch.nn.Module):
    """``layers`` in sequence, and a trainable weight the forward never uses: four times the rest's size,
    so that it lies in both ranks' ZeRO partitions (the check is per partition: a rank whose partition
    missed it would go on to the norm's collective alone)."""

    def __init__(self, layers):
        super().__init__()
        self.used = torch.nn.Sequential(*layers)
        size = sum(p.numel() for p in self.used.parameters())
        self.unused = torch.nn.Parameter(torch.zeros(4 * size))

    def forward(self, x):
        return self.used(x)


def unused_parameter_case(ignore):
    """ZeRO-2 with CPU offload and a trainable parameter unused in producing the loss: upstream's offload norm asserts,
    naming ``zero_optimization.ignore_unused_parameters``, unless that option is true; then it takes the norm of the
    used parameters. The single collective replaced that norm (patch
    Take-the-ZeRO-1-2-global-grad-norm-in-one-fused-op-a keeps the check). Returns the assertion's message (None when
    none was raised) and the norm."""

    def run():
        layers = make_layers()
        model = WithUnusedParameter(copy.deepcopy(layers))
        config = base_config(zero(2, ignore_unused_parameters=ignore, **OFFLOAD))
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        in_partition = any(p is model.unused for group in engine.optimizer.params_in_partition for p in group)
        everywhere = torch.tensor([float(in_partition)])
        dist.all_reduce(everywhere, op=dist.ReduceOp.MIN)
        if not everywhere.item():  # on every rank alike: the test's premise, not the check, is broken
            raise AssertionError("the unused parameter is not in every rank's partition")
        inputs, targets = global_batch(MICRO * GAS * dist.get_world_size())
        x, y = rank_share(inputs, targets, dist.get_rank(), MICRO * GAS)
        raised = None
        for batch, target in micro_batches(x, y, MICRO, GAS):
            engine.backward(mse(engine(batch), target))
            try:
                engine.step()
            except AssertionError as error:
                raised = str(error)
                break
        norm = engine.get_global_grad_norm() if raised is None else None
        engine.destroy()
        return {
            "raised": raised,
            "norm": None if norm is None else float(norm),
            "reference_norm": reference_norm(layers, inputs, targets),
        }

    return run


def newton_schulz_in_fp64(ns_method="gram"):
    return torch.float64


def muon_case(extra):
    """The Muon optimizer (2-D weights orthogonalized, the rest Adam), clipping 1.0: the norm (the
    gradient's, which the clip uses before Newton-Schulz runs) and the collectives of the boundary step.

    The Newton-Schulz orthogonalization runs in fp64 here: by default it runs in fp16 (bf16) matmuls, whose
    CPU kernels differ between torch builds. That alone moved the fp32 case's norm by 3.1e-3 between torch
    2.13.0 (CPU) and 2.14.1 (CUDA build, run on the CPU), 4.560454 vs 4.574610; in fp64 both give 4.564153.
    What is compared is the engine's fp16 path and its loss scale, not the orthogonalization's rounding."""

    def run():
        from deepspeed.runtime.zero.muon import original_muon
        original_muon.ns_compute_dtype = newton_schulz_in_fp64
        from deepspeed.utils import safe_get_full_fp32_param
        layers = make_layers()
        model = torch.nn.Sequential(*copy.deepcopy(layers))
        config = base_config(dict(extra, optimizer={"type": "Muon", "params": {"lr": 0.01}}))
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        dtype = next(engine.module.parameters()).dtype
        inputs, targets = global_batch(MICRO * GAS * dist.get_world_size())
        x, y = rank_share(inputs, targets, dist.get_rank(), MICRO * GAS)
        losses = ((mse(engine(batch), target), {}) for batch, target in micro_batches(x, y, MICRO, GAS, dtype))
        step = train_step_counting_collectives(engine, losses)
        weights = torch.cat([safe_get_full_fp32_param(p).detach().flatten() for p in engine.module.parameters()])
        engine.destroy()
        return {
            **step,
            "weights": weights.tolist(),
            "skipped_steps": engine.skipped_steps,
        }

    return run


def moe_case(stage):

    def run():
        from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
        model = MoENet(ep_size=2)
        inputs, targets = global_batch(MICRO * GAS * dist.get_world_size())
        groups = split_params_into_different_moe_groups_for_optimizer({
            "params": list(model.parameters()),
            "name": "dense"
        })
        engine, *_ = deepspeed.initialize(model=model,
                                          model_parameters=groups,
                                          config=base_config({"zero_optimization": {
                                              "stage": stage
                                          }}))
        reference = fp64_norm(*fp64_gradients(model, inputs, targets))
        x, y = rank_share(inputs, targets, dist.get_rank(), MICRO * GAS)
        losses = ((mse(engine(batch), target), {}) for batch, target in micro_batches(x, y, MICRO, GAS))
        step = train_step_counting_collectives(engine, losses)
        for _ in range(2):  # the norm's plan must outlive the step
            for batch, target in micro_batches(x, y, MICRO, GAS):
                engine.backward(mse(engine(batch), target))
                engine.step()
        engine.destroy()
        return {
            **step,
            "norm_plan_builds": norm_plan_builds(engine),
            "reference_norm": reference,
        }

    return run


def pipeline_module(layers, **kwargs):
    from deepspeed.pipe import PipelineModule
    return PipelineModule(layers=layers, num_stages=2, loss_fn=mse, partition_method="uniform", **kwargs)


def train_pipeline_batch(module, model_parameters, extra_config, dtype=None):
    """One train_batch() of the global batch: the reported norm and the reducing collectives issued."""
    engine, *_ = deepspeed.initialize(model=module,
                                      model_parameters=model_parameters,
                                      config=base_config(extra_config))
    inputs, targets = global_batch(MICRO * GAS)
    with CollectiveCounter() as counter:
        engine.train_batch(data_iter=iter(micro_batches(inputs, targets, MICRO, GAS, dtype)))
    norm = engine.get_global_grad_norm()
    engine.destroy()
    return {
        "norm": None if norm is None else float(norm),
        "reducing_collectives_in_train_batch": len(counter.calls),
    }


def pipeline_uneven_groups():
    """2 stages, ZeRO-1, fp32: stage 0 puts its parameters in 2 groups, stage 1 in 1."""
    layers = make_layers()
    module = pipeline_module(copy.deepcopy(layers))
    stage = module.stage_id
    groups = two_groups(module) if stage == 0 else [{"params": [p for p in module.parameters()]}]
    result = train_pipeline_batch(module, groups, {"zero_optimization": {"stage": 1}})
    inputs, targets = global_batch(MICRO * GAS)
    return dict(result, stage=stage, groups=len(groups), reference_norm=reference_norm(layers, inputs, targets))


def pipeline_fp16_norm():
    """2 stages, fp16 without ZeRO, 2 parameter groups on each stage: the norm and its collectives."""
    layers = make_layers()
    module = pipeline_module(copy.deepcopy(layers))
    result = train_pipeline_batch(module, two_groups(module), {"fp16": {
        "enabled": True,
        "initial_scale_power": 8
    }}, torch.half)
    inputs, targets = global_batch(MICRO * GAS)
    return dict(result, reference_norm=reference_norm(layers, inputs, targets))


def pipeline_buffer_dtype():
    """The receive buffer for gradients must come back in the dtype asked for, also when reused."""
    module = pipeline_module(make_layers())
    engine, *_ = deepspeed.initialize(model=module,
                                      model_parameters=[p for p in module.parameters()],
                                      config=base_config({}))
    first = engine._allocate_or_extend_buffers(0, (8, ), torch.float32)
    second = engine._allocate_or_extend_buffers(0, (4, ), torch.bfloat16)
    engine.destroy()
    return [str(first.dtype), str(second.dtype)]


def pipeline_fp32_norm():
    """2 stages, no ZeRO, fp32, clipping on: the engine reports the global norm (upstream: None)."""
    layers = make_layers()
    module = pipeline_module(copy.deepcopy(layers))
    result = train_pipeline_batch(module, [p for p in module.parameters()], {})
    inputs, targets = global_batch(MICRO * GAS)
    return dict(result, reference_norm=reference_norm(layers, inputs, targets))


def tied_specs():
    """A weight used on both stages (bias-free, so the weight is all there is to tie)."""
    from deepspeed.pipe import LayerSpec, TiedLayerSpec
    return [
        TiedLayerSpec("shared", torch.nn.Linear, IN, IN, bias=False),
        LayerSpec(torch.nn.Tanh),
        LayerSpec(torch.nn.Linear, IN, IN),
        LayerSpec(torch.nn.Tanh),
        TiedLayerSpec("shared", torch.nn.Linear, IN, IN, bias=False),
        LayerSpec(torch.nn.Linear, IN, OUT),
    ]


def tied_reference_norm(inputs, targets, base_seed=1234):
    """fp64 norm of the same network built in one piece: each layer seeded as PipelineModule's
    seed_layers does, the tied weight built once (its first occurrence) and used twice."""
    from deepspeed.runtime.utils import set_random_seed
    built, tied = [], {}
    for index, spec in enumerate(tied_specs()):
        set_random_seed(base_seed + index)
        key = getattr(spec, "key", None)
        if key is None:
            built.append(spec.build())
        else:
            tied.setdefault(key, spec.build())
            built.append(tied[key])
    model = torch.nn.Sequential(*built).double()
    torch.nn.functional.mse_loss(model(inputs.double()), targets.double()).backward()
    return float(torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in model.parameters()])))


def pipeline_tied_fp32_norm():
    """2 stages share one weight: its (all-reduced) gradient counts once in the norm, not per stage."""
    module = pipeline_module(tied_specs(), seed_layers=True)
    result = train_pipeline_batch(module, [p for p in module.parameters()], {})
    inputs, targets = global_batch(MICRO * GAS)
    return dict(result, reference_norm=tied_reference_norm(inputs, targets))


BF16_OPTIMIZER = {
    "bf16": {
        "enabled": True
    },
    "zero_optimization": {
        "stage": 1
    },
    "data_types": {
        "grad_accum_dtype": "fp32"
    }
}
OFFLOAD = {"offload_optimizer": {"device": "cpu"}}


def zero(stage, **extra):
    return {"zero_optimization": dict(stage=stage, **extra)}


FUSED_ADAM = {"optimizer": dict(type="Adam", params=dict(lr=1e-3, torch_adam=False))}
# The paths of data_parallel_case by name: each gives a mean-mode case and a "_per_item" case.
DATA_PARALLEL_PATHS = {
    "zero0_fp32": {},
    "zero1_fp32": zero(1),
    "zero2_fp32": zero(2),
    "zero2_offload_fp32": zero(2, **OFFLOAD),
    "zero1_offload_fp32": zero(1, **OFFLOAD),
    "zero2_fp16": dict(FP16, **zero(2)),
    "zero1_bf16_fp32_accumulation": BF16_OPTIMIZER,
    "zero2_bf16": dict(BF16, **zero(2)),
    "zero0_fp16": FP16,
    "zero0_fp16_fused_adam": dict(FP16, **FUSED_ADAM),
    "zero3_fp32": zero(3),
    "zero3_offload_fp32": zero(3, **OFFLOAD),
    "zero3_fp16": dict(FP16, **zero(3)),
}

# Pipeline cases last: the pipeline grid stays in deepspeed.utils.groups for the process's lifetime.
CASES = {
    **{
        name: data_parallel_case(extra)
        for name, extra in DATA_PARALLEL_PATHS.items()
    },
    "zero2_fp16_overflow": overflow_case(2),
    "zero3_fp16_overflow": overflow_case(3),
    "zero0_fp16_lamb_legacy_step": lamb_legacy_step,
    "zero1_no_norm_fp32": no_norm_case(zero(1, compute_grad_norm=False)),
    "zero2_no_norm_fp32": no_norm_case(zero(2, compute_grad_norm=False)),
    "zero2_no_norm_fp16": no_norm_case(dict(FP16, **zero(2, compute_grad_norm=False))),
    "zero1_muon_fp32": muon_case(zero(1)),
    "zero2_muon_fp32": muon_case(zero(2)),
    "zero1_muon_fp16": muon_case(dict(FP16, **zero(1))),
    "zero2_muon_fp16": muon_case(dict(FP16, **zero(2))),
    "zero2_offload_muon_fp16": muon_case(dict(FP16, **zero(2, **OFFLOAD))),
    "zero1_moe_fp32": moe_case(1),
    "zero2_moe_fp32": moe_case(2),
    "zero2_offload_unused_parameter_refused": unused_parameter_case(ignore=False),
    "zero2_offload_unused_parameter_ignored": unused_parameter_case(ignore=True),
    "pipeline_buffer_dtype": pipeline_buffer_dtype,
    "pipeline_tied_fp32_norm": pipeline_tied_fp32_norm,
    "pipeline_fp16_norm": pipeline_fp16_norm,
    "pipeline_fp32_norm": pipeline_fp32_norm,
    "pipeline_uneven_groups": pipeline_uneven_groups,
}

# "loss_normalization": "per_item" on every data-parallel path (benchmarks/norm_collectives.py sets them
# beside mean mode). Before the pipeline cases, which stay last.
CASES = {
    **{
        name: case
        for name, case in CASES.items() if not name.startswith("pipeline")
    },
    **{
        f"{name}_per_item": data_parallel_case(extra, per_item=True)
        for name, extra in DATA_PARALLEL_PATHS.items()
    },
    **{
        name: case
        for name, case in CASES.items() if name.startswith("pipeline")
    },
}

if __name__ == "__main__":
    force_fp16_on_cpu()
    run_cases(CASES)
