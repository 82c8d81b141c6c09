# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Rank worker: the global grad norm and the update of an MoE network under tensor parallelism, at
several splits of one global batch of 8 samples (micro-batch x GAS x data-parallel ranks), against fp64
PyTorch on the whole batch.

Megatron's layout through an mpu: tensor-parallel groups of consecutive ranks, data-parallel groups
strided; the ranks of one tensor-parallel group see the same samples. The output layer is row-parallel
(each tensor-parallel rank holds a slice of its weight's columns, as Megatron splits a layer), every other
dense parameter is a tensor-parallel replica. The MoE layer has 2 experts and runs as DeepSpeed lays it
out:

- ``ep2``: expert parallel 2, experts not tensor-parallel (the MoE layer's default). The expert groups
  are built without the mpu (consecutive ranks), so an expert-parallel group holds the tensor-parallel
  ranks of one data-parallel rank; each of them routes only its share of the capacity (the layer's
  drop_tokens), so each expert sees every token once and each rank holds a different expert.
- ``ep1``: expert parallel 1, experts not tensor-parallel: every rank holds both experts, each
  tensor-parallel rank again computes them on its share of the capacity only.
- ``ep1_expert_tp``: ``enable_expert_tensor_parallelism``, groups built from the mpu: the tokens are
  gathered back before the experts, so the tensor-parallel ranks compute the same expert gradients
  (plain linear experts, not split: replicas).
- ``ep1_expert_tp_split``: the same with Megatron's parallel MLP as the expert (what expert tensor
  parallelism is for): a column-parallel linear, ReLU, a row-parallel linear; each tensor-parallel rank
  holds its slice of both weights and of the first bias (counted on every rank), the last bias whole
  (a replica, counted once).

Case names are ``<layout>_<path>_m<micro>_g<gas>``.
"""

import torch  # noqa: E402

import deepspeed  # noqa: E402
import deepspeed.comm as dist  # noqa: E402
from toolkit.collectives import train_step_counting_collectives  # noqa: E402
from helpers.engine_paths import ZERO_PATHS, relative_update_error  # noqa: E402
from helpers.moe_model import forget_expert_groups, linear, top1_moe  # noqa: E402
from helpers.rank_cases import force_fp16_on_cpu, run_cases  # noqa: E402
from helpers.small_model import IN, OUT, global_batch, micro_batches, mse, rank_share, sgd_config  # noqa: E402

GLOBAL_BATCH = 8
TP = 2
HIDDEN = 16
FFN = 2 * HIDDEN  # the split expert's inner width
NUM_EXPERTS = 2
LR, CLIP = 0.1, 1.0

# layout -> (ep_size, enable_expert_tensor_parallelism, experts split by tensor parallelism)
LAYOUTS = {
    "ep2": (2, False, False),
    "ep1": (1, False, False),
    "ep1_expert_tp": (1, True, False),
    "ep1_expert_tp_split": (1, True, True),
}
PATHS = ZERO_PATHS  # path -> (config, ZeRO stage)


class TensorParallelGrid:
    """An mpu in Megatron's layout: tensor-parallel groups [0, 1], [2, 3], ...; data-parallel groups
    [0, 2, ...], [1, 3, ...]. Every rank creates every group, in the same order."""

    def __init__(self, tp):
        world, rank = dist.get_world_size(), dist.get_rank()
        self.tp, self.rank = tp, rank
        for start in range(0, world, tp):
            ranks = list(range(start, start + tp))
            group = dist.new_group(ranks)
            if rank in ranks:
                self.tp_group = group
        for offset in range(tp):
            ranks = list(range(offset, world, tp))
            group = dist.new_group(ranks)
            if rank in ranks:
                self.dp_group, self.dp_ranks = group, ranks

    def get_model_parallel_rank(self):
        return self.rank % self.tp

    def get_model_parallel_world_size(self):
        return self.tp

    def get_model_parallel_group(self):
        return self.tp_group

    def get_data_parallel_rank(self):
        return self.rank // self.tp

    def get_data_parallel_world_size(self):
        return len(self.dp_ranks)

    def get_data_parallel_group(self):
        return self.dp_group

    def get_data_parallel_group_ranks(self):
        return self.dp_ranks


def tp_gathered(tensor, dim, group):
    """The whole of a layer split over the tensor-parallel ranks along ``dim``: every rank's slice, in fp32."""
    tensor = tensor.detach().float().contiguous()
    slices = [torch.empty_like(tensor) for _ in range(TP)]
    dist.all_gather(slices, tensor, group=group)
    return torch.cat(slices, dim=dim)


class SharedRef:
    """Held by reference through the MoE layer's deepcopy of its expert (a process group cannot be copied)."""

    def __init__(self, value):
        self.value = value

    def __deepcopy__(self, memo):
        return self


class SplitExpert(torch.nn.Module):
    """Megatron's parallel MLP as an expert: a column-parallel linear (this tensor-parallel rank's rows of
    ``w1`` and ``b1``), ReLU, a row-parallel linear (its columns of ``w2``; the partial outputs summed over
    the group), then ``b2``, whole on every rank. ``parts`` / ``whole`` / ``own`` / ``function`` give the
    fp64 reference what it needs: the parameters in order, gathered to the whole layers, cut back to this
    rank's slices, and the expert as a function of the whole ones."""

    def __init__(self, tp_group, tp_rank):
        super().__init__()
        first, second = torch.nn.Linear(HIDDEN, FFN), torch.nn.Linear(FFN, HIDDEN)
        self.group = SharedRef(tp_group)
        self.rows = slice(tp_rank * FFN // TP, (tp_rank + 1) * FFN // TP)
        self.w1 = torch.nn.Parameter(first.weight.detach()[self.rows].clone())
        self.b1 = torch.nn.Parameter(first.bias.detach()[self.rows].clone())
        self.w2 = torch.nn.Parameter(second.weight.detach()[:, self.rows].clone())
        self.b2 = torch.nn.Parameter(second.bias.detach().clone())

    def mark_split(self):
        # Set on each copy the MoE layer made: a parameter's deepcopy does not keep its attributes.
        for param in (self.w1, self.b1, self.w2):
            param.tensor_model_parallel = True

    def forward(self, x):
        from deepspeed.module_inject.layers import ColumnParallel, RowParallel
        hidden = torch.relu(ColumnParallel.apply(self.group.value, x) @ self.w1.T + self.b1)
        return RowParallel.apply(self.group.value, hidden @ self.w2.T, False) + self.b2

    def parts(self):
        return [self.w1, self.b1, self.w2, self.b2]

    def whole(self):
        group = self.group.value
        return [
            tp_gathered(self.w1, 0, group),
            tp_gathered(self.b1, 0, group),
            tp_gathered(self.w2, 1, group),
            self.b2.detach().float()
        ]

    def own(self, whole):
        w1, b1, w2, b2 = whole
        return [w1[self.rows], b1[self.rows], w2[:, self.rows], b2]

    @staticmethod
    def function(whole):
        w1, b1, w2, b2 = whole
        return lambda hidden: torch.relu(hidden @ w1.T + b1) @ w2.T + b2


class LinearExpert(torch.nn.Linear):
    """A linear expert, whole on every rank, with ``SplitExpert``'s interface for the reference."""

    def mark_split(self):
        pass

    def parts(self):
        return [self.weight, self.bias]

    def whole(self):
        return [self.weight.detach().float(), self.bias.detach().float()]

    def own(self, whole):
        return whole

    @staticmethod
    def function(whole):
        return linear(*whole)


class MoETPNet(torch.nn.Module):
    """Linear, a top-1 MoE layer of 2 experts (no token dropped: routing a rank's samples equals routing
    the whole batch), a row-parallel linear. Expert ``e`` starts from the shared weights plus
    ``0.1 * (e + 1)``."""

    def __init__(self, ep_size, expert_tp, split_experts, mpu, seed=0):
        super().__init__()
        from deepspeed.moe.layer import MoE
        torch.manual_seed(seed)
        self.tp_group, self.tp_rank = mpu.get_model_parallel_group(), mpu.get_model_parallel_rank()
        self.inp = torch.nn.Linear(IN, HIDDEN)
        # Capacity = the rank's tokens (capacity factor = the number of experts), at least TP: no token is
        # dropped, and the capacity splits evenly over the tensor-parallel ranks. (drop_tokens=False would
        # not pad the capacity to TP under expert tensor parallelism, and the layer's split then asserts.)
        expert = SplitExpert(self.tp_group, self.tp_rank) if split_experts else LinearExpert(HIDDEN, HIDDEN)
        self.moe = MoE(hidden_size=HIDDEN,
                       expert=expert,
                       num_experts=NUM_EXPERTS,
                       ep_size=ep_size,
                       k=1,
                       capacity_factor=float(NUM_EXPERTS),
                       min_capacity=TP,
                       drop_tokens=True,
                       use_rts=False,
                       enable_expert_tensor_parallelism=expert_tp)
        out = torch.nn.Linear(HIDDEN, OUT)
        self.out_slice = slice(self.tp_rank * HIDDEN // TP, (self.tp_rank + 1) * HIDDEN // TP)
        self.out_weight = torch.nn.Parameter(out.weight.detach()[:, self.out_slice].clone())
        self.out_weight.tensor_model_parallel = True  # split: counted on every tensor-parallel rank
        self.out_bias = torch.nn.Parameter(out.bias.detach().clone())
        self.ep_size = ep_size
        # DeepSpeed builds the expert groups in deepspeed.initialize; the experts' weights must differ
        # before it copies them (fp32 master weights, ZeRO partitions). ep2 groups are consecutive ranks
        # (checked by ep_rank once built); ep1 holds both experts everywhere.
        self.expected_ep_rank = dist.get_rank() % ep_size
        self.offset_experts(self.expected_ep_rank)
        for expert in self.local_experts():
            expert.mark_split()

    def local_experts(self):
        return list(self.moe.deepspeed_moe.experts.deepspeed_experts)

    def ep_rank(self):
        from deepspeed.utils import groups
        rank = dist.get_rank(group=groups._get_expert_parallel_group(self.moe.expert_group_name))
        assert rank == self.expected_ep_rank, f"expert-parallel rank {rank}, expected {self.expected_ep_rank}"
        return rank

    def global_expert_index(self, local):
        return self.ep_rank() * len(self.local_experts()) + local

    def offset_experts(self, ep_rank):
        with torch.no_grad():
            for local, expert in enumerate(self.local_experts()):
                for param in expert.parameters():
                    param.add_(0.1 * (ep_rank * len(self.local_experts()) + local + 1))

    def dense(self):
        return [self.inp.weight, self.inp.bias, self.moe.deepspeed_moe.gate.wg.weight, self.out_weight, self.out_bias]

    def own(self):
        """This rank's parameters, in the order of ``reference_grads``."""
        return self.dense() + [p for expert in self.local_experts() for p in expert.parts()]

    def own_slices(self, dense_tensors):
        """``dense_tensors`` of the whole layers (as ``fp64_gradients`` returns them), cut to what this rank
        holds: its slice of the output weight."""
        inp_w, inp_b, gate_w, out_w, out_b = dense_tensors
        return [inp_w, inp_b, gate_w, out_w[:, self.out_slice], out_b]

    def forward(self, x):
        # DeepSpeed's own tensor-parallel autograd functions (AutoTP's): ColumnParallel is the identity
        # forward and sums the input's gradient over the group backward (each rank's slice gives only part
        # of it); RowParallel sums the partial outputs forward.
        from deepspeed.module_inject.layers import ColumnParallel, RowParallel
        hidden = ColumnParallel.apply(self.tp_group, self.moe(torch.relu(self.inp(x)))[0])
        partial = hidden[:, self.out_slice] @ self.out_weight.T
        return RowParallel.apply(self.tp_group, partial, False) + self.out_bias


def fp64_gradients(model, inputs, targets):
    """fp64 gradients of the mean-square loss over the whole batch: (dense, experts[e] = the expert's
    ``parts()``), of the whole layers (the slices of split ones gathered)."""
    from deepspeed.utils import groups
    group = groups._get_expert_parallel_group(model.moe.expert_group_name)

    def gathered(tensors):
        parts = []
        for tensor in tensors:
            tensor = tensor.contiguous()
            ranks = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group=group))]
            dist.all_gather(ranks, tensor, group=group)
            parts.append(ranks)
        # global expert index = ep rank * local experts + local index
        return [part.double().requires_grad_(True) for ep in zip(*parts) for part in ep]

    local = [expert.whole() for expert in model.local_experts()]
    # experts[e][k]: part k of global expert e
    experts = list(zip(*[gathered([whole[k] for whole in local]) for k in range(len(local[0]))]))
    function = model.local_experts()[0].function
    whole = model.dense()[:3] + [tp_gathered(model.out_weight, 1, model.tp_group), model.out_bias]
    dense = [p.detach().double().requires_grad_(True) for p in whole]
    inp_w, inp_b, gate_w, out_w, out_b = dense
    mixed = top1_moe(torch.relu(inputs.double() @ inp_w.T + inp_b), gate_w, map(function, experts))
    torch.nn.functional.mse_loss(mixed @ out_w.T + out_b, targets.double()).backward()
    return [p.grad for p in dense], [[part.grad for part in expert] for expert in experts]


def config(path, micro, gas):
    extra, stage = PATHS[path]
    cfg = dict(sgd_config(micro, gas, CLIP, LR), zero_optimization={"stage": stage})
    cfg.update(extra)
    return cfg


def case(layout, path, micro, gas):

    def run():
        from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
        ep_size, expert_tp, split_experts = LAYOUTS[layout]
        forget_expert_groups()
        mpu = TensorParallelGrid(TP)
        model = MoETPNet(ep_size, expert_tp, split_experts, mpu)
        param_groups = split_params_into_different_moe_groups_for_optimizer({
            "params": list(model.parameters()),
            "name": "dense"
        })
        cfg = config(path, micro, gas)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups, config=cfg, mpu=mpu)
        module = engine.module
        dtype = next(module.parameters()).dtype
        inputs, targets = global_batch(GLOBAL_BATCH)
        inputs = inputs.to(dtype).float()  # the engine sees these values: the reference too
        dense_grads, expert_grads = fp64_gradients(module, inputs, targets)
        flat = [g.flatten() for g in dense_grads] + [g.flatten() for pair in expert_grads for g in pair]
        reference_norm = float(torch.linalg.vector_norm(torch.cat(flat)))
        before = [p.detach().double().clone() for p in module.own()]

        dp_world, dp_rank = mpu.get_data_parallel_world_size(), mpu.get_data_parallel_rank()
        per_rank = GLOBAL_BATCH // dp_world
        assert per_rank == micro * gas, f"split {micro} x {gas} x {dp_world} != {GLOBAL_BATCH}"
        x, y = rank_share(inputs, targets, dp_rank, per_rank)  # tensor-parallel ranks: the same samples
        losses = ((mse(engine(batch), target), {}) for batch, target in micro_batches(x, y, micro, gas, dtype=dtype))
        step = train_step_counting_collectives(engine, losses)
        after = [p.detach().double() for p in module.own()]
        locals_ = [module.global_expert_index(i) for i in range(len(module.local_experts()))]
        own_expert_grads = [module.local_experts()[i].own(expert_grads[e]) for i, e in enumerate(locals_)]
        engine.destroy()

        coef = min(1.0, CLIP / (reference_norm + 1e-6))
        reference_grads = module.own_slices(dense_grads) + [g for grads in own_expert_grads for g in grads]
        expected = [(w - LR * coef * g).to(dtype).double() for w, g in zip(before, reference_grads)]
        n_dense = len(dense_grads)
        return {
            "optimizer": type(engine.optimizer).__name__,
            "experts_held": locals_,
            **step,
            "reference_norm": reference_norm,
            "clip_coefficient": coef,
            "update_error": relative_update_error(after, expected, before),
            "expert_update_error": relative_update_error(after[n_dense:], expected[n_dense:], before[n_dense:]),
        }

    return run


def splits(world_size):
    """micro x GAS of a data-parallel rank's share; a micro-batch holds at least TP samples (the MoE layer
    wants at least min_capacity tokens)."""
    per_rank = GLOBAL_BATCH // (world_size // TP)
    return [(micro, per_rank // micro) for micro in (per_rank, per_rank // 2, per_rank // 4) if micro >= TP]


def shape_gathers_for_gloo():
    """The MoE layer gathers its tokens over the tensor-parallel ranks into a flat buffer
    (deepspeed/moe/mappings.py), which NCCL takes; gloo wants the output shaped as the inputs stacked
    along dim 0 (else: "ProcessGroupGloo::allgather: invalid tensor size"). Same memory, reshaped."""
    original = dist.all_gather_into_tensor

    def shaped(output_tensor, input_tensor, group=None, async_op=False):
        if output_tensor.dim() == 1 and input_tensor.dim() > 1:
            output_tensor = output_tensor.view(-1, *input_tensor.shape[1:])
        return original(output_tensor, input_tensor, group=group, async_op=async_op)

    dist.all_gather_into_tensor = shaped


if __name__ == "__main__":
    force_fp16_on_cpu()
    shape_gathers_for_gloo()
    import os
    world = int(os.environ.get("WORLD_SIZE", "2"))
    run_cases({
        f"{layout}_{path}_m{m}_g{g}": case(layout, path, m, g)
        for layout in LAYOUTS
        for path in PATHS
        for m, g in dict.fromkeys(splits(world))
    })
