# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Rank worker: the global grad norm and the update of a pipeline with tensor parallelism inside its
stages (4 ranks: 2 stages x 2 tensor-parallel ranks, data parallel 1), at every split of one global batch
of 8 samples (micro-batch x GAS), against fp64 PyTorch on the whole batch.

The topology is the pipeline's own (``PipeModelDataParallelTopology``: stage 0 on ranks 0-1, stage 1 on
ranks 2-3); its slice group is the tensor-parallel group. Layers: linear (a replica) | Megatron's parallel
MLP | Megatron's parallel MLP | linear (a replica): each MLP a column-parallel linear (this rank's rows of
``w1`` and ``b1``), tanh, a row-parallel linear (its columns of ``w2``, the partial outputs summed over the
group), then ``b2`` whole. With tensor parallelism the pipeline sends each activation between stages
partitioned over the tensor-parallel ranks (``pipeline.pipe_partitioned``, on by default) and its gradient
back the same way (``pipeline.grad_partitioned``): the layouts are both on (``pipe_grad``), the activation
only (``pipe``) and neither (``whole``). Case names ``<layout>_<path>_m<micro>_g<gas>``.
"""

import torch  # noqa: E402

import deepspeed  # noqa: E402
import deepspeed.comm as dist  # noqa: E402
from toolkit.collectives import pipeline_batch_counting_collectives  # noqa: E402
from helpers.engine_paths import BF16, FP16, relative_update_error  # noqa: E402
from helpers.master_weights import zero_master_weights  # noqa: E402
from helpers.rank_cases import force_fp16_on_cpu, run_cases  # noqa: E402
from helpers.small_model import IN, OUT, global_batch, micro_batches, mse, sgd_config  # noqa: E402

GLOBAL_BATCH = 8
STAGES, TP = 2, 2
HIDDEN, FFN = 16, 32
LR, CLIP = 0.1, 0.5  # the fp64 norm is 0.81: the step clips
# layout -> (pipeline.pipe_partitioned, pipeline.grad_partitioned)
LAYOUTS = {"pipe_grad": (True, True), "pipe": (True, False), "whole": (False, False)}
# path -> (config, ZeRO stage): the optimizers a pipeline takes
PATHS = {"zero0_fp32": ({}, 0), "zero1_fp32": ({}, 1), "zero0_fp16": (FP16, 0), "zero0_bf16": (BF16, 0)}
SPLITS = [(8, 1), (4, 2), (2, 4)]


class ParallelMLP(torch.nn.Module):
    """tanh, then Megatron's parallel MLP: this tensor-parallel rank's slices of a whole MLP (``whole``: its
    two linears), its weights marked tensor-parallel; the tensor-parallel group is given once the pipeline
    has built it (``group``)."""

    def __init__(self, whole, tp_rank):
        super().__init__()
        first, second = whole
        self.rows = slice(tp_rank * FFN // TP, (tp_rank + 1) * FFN // TP)
        self.w1 = torch.nn.Parameter(first.weight.detach()[self.rows].clone())
        self.b1 = torch.nn.Parameter(first.bias.detach()[self.rows].clone())
        self.w2 = torch.nn.Parameter(second.weight.detach()[:, self.rows].clone())
        self.b2 = torch.nn.Parameter(second.bias.detach().clone())
        for param in (self.w1, self.b1, self.w2):
            param.tensor_model_parallel = True
        self.group = None

    def forward(self, x):
        from deepspeed.module_inject.layers import ColumnParallel, RowParallel
        hidden = torch.tanh(ColumnParallel.apply(self.group, torch.tanh(x)) @ self.w1.T + self.b1)
        return RowParallel.apply(self.group, hidden @ self.w2.T, False) + self.b2

    def own(self, grads):
        """This rank's slices of the whole MLP's (w1, b1, w2, b2) gradients, by parameter name."""
        w1, b1, w2, b2 = grads
        return {"w1": w1[self.rows], "b1": b1[self.rows], "w2": w2[:, self.rows], "b2": b2}


def whole_layers(dtype):
    """The whole network, the same on every rank: linear, (linear, linear), (linear, linear), linear; its
    weights rounded to ``dtype`` (what the engine trains)."""
    torch.manual_seed(0)
    layers = [
        torch.nn.Linear(IN, HIDDEN), (torch.nn.Linear(HIDDEN, FFN), torch.nn.Linear(FFN, HIDDEN)),
        (torch.nn.Linear(HIDDEN, FFN), torch.nn.Linear(FFN, HIDDEN)),
        torch.nn.Linear(HIDDEN, OUT)
    ]
    with torch.no_grad():
        for layer in (layers[0], *layers[1], *layers[2], layers[3]):
            for param in layer.parameters():
                param.copy_(param.to(dtype).float())
    return layers


def fp64_gradients(layers, inputs, targets):
    """[gradients of each layer's parameters, in order] of the mean-square loss over the whole batch."""
    leaves = [[p.detach().double().requires_grad_(True) for p in layer.parameters()]
              for layer in (layers[0], *layers[1], *layers[2], layers[3])]
    (w0, b0), *mlps, (w3, b3) = leaves
    h = inputs.double() @ w0.T + b0
    for (w1, b1), (w2, b2) in (mlps[0:2], mlps[2:4]):
        h = torch.tanh(torch.tanh(h) @ w1.T + b1) @ w2.T + b2
    out = h @ w3.T + b3
    torch.nn.functional.mse_loss(out, targets.double()).backward()
    grads = [[p.grad for p in layer] for layer in leaves]
    return grads[0], grads[1] + grads[2], grads[3] + grads[4], grads[5]


def trained_weights(engine):
    """``{name: the fp32 master weight the optimizer updates}`` in fp64: the module's own in fp32, linked ones
    (BF16_Optimizer), FP16_UnfusedOptimizer's copies of its fp16 parameters."""
    weights = zero_master_weights(engine)
    optimizer = engine.optimizer
    if hasattr(optimizer, "fp16_groups") and hasattr(optimizer, "fp32_groups"):
        masters = {
            id(low): high
            for lows, highs in zip(optimizer.fp16_groups, optimizer.fp32_groups)
            for low, high in zip(lows, highs)
        }
        for name, param in engine.module.named_parameters():
            weights[name] = masters[id(param)].detach().double().clone()
    return weights


def config(layout, path, micro, gas):
    extra, stage = PATHS[path]
    pipe, grad = LAYOUTS[layout]
    cfg = dict(sgd_config(micro, gas, CLIP, LR),
               zero_optimization={"stage": stage},
               pipeline={
                   "pipe_partitioned": pipe,
                   "grad_partitioned": grad
               })
    cfg.update(extra)
    return cfg


def case(layout, path, micro, gas):

    def run():
        from deepspeed.pipe import PipelineModule
        from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
        topology = PipeModelDataParallelTopology(num_pp=STAGES,
                                                 num_mp=TP,
                                                 num_dp=dist.get_world_size() // (STAGES * TP))
        tp_rank = topology.get_coord(dist.get_rank()).model
        dtype = {"zero0_fp16": torch.float16, "zero0_bf16": torch.bfloat16}.get(path, torch.float32)
        whole = whole_layers(dtype)
        mlps = [ParallelMLP(whole[1], tp_rank), ParallelMLP(whole[2], tp_rank)]
        layers = [whole[0], mlps[0], mlps[1], whole[3]]
        module = PipelineModule(layers=layers, topology=topology, loss_fn=mse, partition_method="uniform")
        group = module._grid.get_slice_parallel_group()
        for mlp in mlps:
            mlp.group = group
        engine, *_ = deepspeed.initialize(model=module,
                                          model_parameters=[p for p in module.parameters() if p.requires_grad],
                                          config=config(layout, path, micro, gas))
        layout_taken = (engine.is_pipe_partitioned, engine.is_grad_partitioned)
        assert layout_taken == LAYOUTS[layout], f"(pipe_partitioned, grad_partitioned) {layout_taken}"

        inputs, targets = global_batch(GLOBAL_BATCH)
        inputs = inputs.to(dtype).float()  # the engine sees these values: the reference too
        first, mlp1, mlp2, last = fp64_gradients(whole, inputs, targets)
        reference_norm = float(
            torch.linalg.vector_norm(torch.cat([g.flatten() for g in (*first, *mlp1, *mlp2, *last)])))
        coef = min(1.0, CLIP / (reference_norm + 1e-6))
        # PipelineModule names a layer's parameters "<layer index>.<name>"
        grads = {"0.weight": first[0], "0.bias": first[1], "3.weight": last[0], "3.bias": last[1]}
        for index, (mlp, mlp_grads) in enumerate(zip(mlps, (mlp1, mlp2)), start=1):
            grads.update({f"{index}.{name}": g for name, g in mlp.own(mlp_grads).items()})

        before = trained_weights(engine)
        step = pipeline_batch_counting_collectives(engine, micro_batches(inputs, targets, micro, gas, dtype=dtype))
        after = trained_weights(engine)
        engine.destroy()
        names = sorted(before)
        expected = {n: before[n] - LR * coef * grads[n] for n in names}
        return {
            **step,
            "stage": engine.stage_id,
            "tp_rank": tp_rank,
            "reference_norm": reference_norm,
            "clip_coefficient": coef,
            "update_error": relative_update_error(*([d[n] for n in names] for d in (after, expected, before))),
        }

    return run


if __name__ == "__main__":
    force_fp16_on_cpu()
    run_cases({
        f"{layout}_{path}_m{m}_g{g}": case(layout, path, m, g)
        for layout in LAYOUTS
        for path in PATHS
        for m, g in SPLITS
    })
