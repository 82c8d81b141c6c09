# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Rank worker: the global grad norm and the update of an MoE network under pipeline parallelism, at
several splits of one global batch of 8 samples (micro-batch x GAS x data-parallel ranks), against fp64
PyTorch on the whole batch.

A 2-stage PipelineModule: linear, MoE block | MoE block, linear. Each MoE block is a top-1 MoE layer of
2 experts (both stages hold one: every rank must take part in building the expert groups). 2 ranks: data
parallel 1, expert parallel 1 (a stage's rank holds both experts of its layer); 4 ranks: data parallel 2,
expert parallel 2 (each data-parallel rank of a stage holds a different expert). Expert ``e`` of block
``b`` starts from the shared weights plus ``0.1 * (e + 1) * b``. Case names ``<path>_m<micro>_g<gas>``.
"""

import torch  # noqa: E402

import deepspeed  # noqa: E402
import deepspeed.comm as dist  # noqa: E402
from toolkit.collectives import pipeline_batch_counting_collectives  # noqa: E402
from helpers.engine_paths import BF16, FP16, relative_update_error  # noqa: E402
from helpers.moe_model import forget_expert_groups, linear, top1_moe  # noqa: E402
from helpers.rank_cases import force_fp16_on_cpu, run_cases  # noqa: E402
from helpers.small_model import IN, OUT, global_batch, micro_batches, mse, rank_share, sgd_config  # noqa: E402

GLOBAL_BATCH = 8
HIDDEN = 16
NUM_EXPERTS = 2
MOE_BLOCKS = (1, 2)  # layer indices of the MoE blocks
LR, CLIP = 0.1, 1.0
# path -> (config, ZeRO stage)
PATHS = {"zero0_fp32": ({}, 0), "zero1_fp32": ({}, 1), "zero0_fp16": (FP16, 0), "zero0_bf16": (BF16, 0)}


class MoEBlock(torch.nn.Module):
    """A pipeline layer: ReLU, then the MoE layer; passes on its output (the first of the MoE layer's
    three results). Capacity = the micro-batch (factor = the number of experts): no token dropped."""

    def __init__(self, ep_size):
        super().__init__()
        from deepspeed.moe.layer import MoE
        self.moe = MoE(hidden_size=HIDDEN,
                       expert=torch.nn.Linear(HIDDEN, HIDDEN),
                       num_experts=NUM_EXPERTS,
                       ep_size=ep_size,
                       k=1,
                       capacity_factor=float(NUM_EXPERTS),
                       min_capacity=1,
                       drop_tokens=True,
                       use_rts=False)

    def experts(self):
        return list(self.moe.deepspeed_moe.experts.deepspeed_experts)

    def forward(self, x):
        return self.moe(torch.relu(x))[0]


def make_layers(ep_size, ep_rank):
    """The network's layers with the experts expert-parallel rank ``ep_rank`` holds (the same shared
    weights at any ep_size: the experts are copies of one module, made without drawing random numbers)."""
    torch.manual_seed(0)
    layers = [torch.nn.Linear(IN, HIDDEN), MoEBlock(ep_size), MoEBlock(ep_size), torch.nn.Linear(HIDDEN, OUT)]
    for block in MOE_BLOCKS:
        experts = layers[block].experts()
        for local, expert in enumerate(experts):
            with torch.no_grad():
                for param in expert.parameters():
                    param.add_(0.1 * (ep_rank * len(experts) + local + 1) * block)
    return layers


def expert_name(block, expert, what):
    return f"{block}.moe.deepspeed_moe.experts.deepspeed_experts.{expert}.{what}"


def fp64_gradients(layers, inputs, targets):
    """{PipelineModule parameter name (experts by their global index): fp64 gradient} of the mean-square
    loss over the whole batch; top-1 routing scales each sample's expert output by its gate probability."""
    leaves = {}

    def leaf(name, tensor):
        leaves[name] = tensor.detach().double().requires_grad_(True)
        return leaves[name]

    h = inputs.double() @ leaf("0.weight", layers[0].weight).T + leaf("0.bias", layers[0].bias)
    for block in MOE_BLOCKS:
        h = torch.relu(h)
        gate = leaf(f"{block}.moe.deepspeed_moe.gate.wg.weight", layers[block].moe.deepspeed_moe.gate.wg.weight)
        experts = []
        for e, expert in enumerate(layers[block].experts()):
            weight = leaf(expert_name(block, e, "weight"), expert.weight)
            experts.append(linear(weight, leaf(expert_name(block, e, "bias"), expert.bias)))
        h = top1_moe(h, gate, experts)
    out = h @ leaf("3.weight", layers[3].weight).T + leaf("3.bias", layers[3].bias)
    torch.nn.functional.mse_loss(out, targets.double()).backward()
    return {name: tensor.grad for name, tensor in leaves.items()}


def config(path, micro, gas):
    extra, stage = PATHS[path]
    cfg = dict(sgd_config(micro, gas, CLIP, LR), zero_optimization={"stage": stage})
    cfg.update(extra)
    return cfg


def case(path, micro, gas):

    def run():
        from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
        from deepspeed.pipe import PipelineModule
        from deepspeed.utils import groups
        forget_expert_groups()
        world = dist.get_world_size()
        dp = world // 2
        ep_size = dp  # 2 ranks: 1; 4 ranks: 2 (the data-parallel ranks of a stage)
        ep_rank = dist.get_rank() % dp  # stages are consecutive ranks; expert groups too (checked below)
        layers = make_layers(ep_size, ep_rank)
        # The layers themselves, not copies: a deep copy of a parameter drops the attributes that mark
        # the experts' (allreduce, group_name).
        module = PipelineModule(layers=layers, num_stages=2, loss_fn=mse, partition_method="uniform")
        trained = [p for p in module.parameters() if p.requires_grad]
        param_groups = split_params_into_different_moe_groups_for_optimizer({"params": trained, "name": "dense"})
        engine, *_ = deepspeed.initialize(model=module, model_parameters=param_groups, config=config(path, micro, gas))
        assert engine.grid.get_data_parallel_world_size() == dp
        dtype = next(engine.module.parameters()).dtype
        blocks = [m for m in engine.module.modules() if isinstance(m, MoEBlock)]
        for block in blocks:
            group = groups._get_expert_parallel_group(block.moe.expert_group_name)
            assert dist.get_rank(group=group) == ep_rank, "expert-parallel groups are not consecutive ranks"

        inputs, targets = global_batch(GLOBAL_BATCH)
        inputs = inputs.to(dtype).float()  # the engine sees these values: the reference too
        reference_layers = make_layers(1, 0)
        if dtype != torch.float32:
            reference_layers = [layer.to(dtype).float() for layer in reference_layers]
        grads = fp64_gradients(reference_layers, inputs, targets)
        reference_norm = float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads.values()])))
        coef = min(1.0, CLIP / (reference_norm + 1e-6))

        def reference_name(name):
            # A local expert j of this rank is global expert ep_rank * local experts + j.
            parts = name.split(".")
            if "deepspeed_experts" in parts:
                at = parts.index("deepspeed_experts") + 1
                parts[at] = str(ep_rank * (NUM_EXPERTS // ep_size) + int(parts[at]))
            return ".".join(parts)

        before = {name: p.detach().double().clone() for name, p in engine.module.named_parameters()}
        x, y = rank_share(inputs, targets, engine.grid.get_data_parallel_id(), micro * gas)
        # The optimizer step runs inside train_batch(): count the collectives of its model step only.
        step = pipeline_batch_counting_collectives(engine, micro_batches(x, y, micro, gas, dtype=dtype))
        after = {name: p.detach().double() for name, p in engine.module.named_parameters()}
        engine.destroy()
        names = sorted(before)
        expected = {n: (before[n] - LR * coef * grads[reference_name(n)]).to(dtype).double() for n in names}
        return {
            **step,
            "stage": engine.stage_id,
            "reference_norm": reference_norm,
            "clip_coefficient": coef,
            "update_error": relative_update_error(*([d[n] for n in names] for d in (after, expected, before))),
        }

    return run


def splits(world_size):
    per_rank = GLOBAL_BATCH // (world_size // 2)
    return [(micro, per_rank // micro) for micro in (per_rank, per_rank // 2, per_rank // 4) if micro >= 2]


if __name__ == "__main__":
    force_fp16_on_cpu()
    import os
    world = int(os.environ.get("WORLD_SIZE", "2"))
    run_cases({f"{path}_m{m}_g{g}": case(path, m, g) for path in PATHS for m, g in splits(world)})
