# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""A small network with one MoE layer, and its fp64 reference on the whole global batch.

Linear, a top-1 MoE layer with one expert per expert-parallel rank (no token dropped, so routing
each rank's samples equals routing the whole batch at once), linear. Expert ``e`` starts from the
shared seed's weights plus ``0.1 * (e + 1)``, the same on every rank that holds it (its
expert-data-parallel replicas), different from every other expert. Without model parallelism
DeepSpeed puts consecutive ranks in an expert-parallel group, so rank ``r`` holds expert
``r % ep_size`` (with ``use_data_before_expert_parallelism``, ``r // (world size / ep_size)``);
fp64_gradients checks that against the groups the engine built.
"""

import torch

import deepspeed.comm as dist
from helpers.small_model import IN, OUT, sample_items_loss_sum

HIDDEN = 16


class MoENet(torch.nn.Module):

    def __init__(self, ep_size=2, hidden=HIDDEN, seed=0, data_before_expert=False):
        super().__init__()
        from deepspeed.moe.layer import MoE
        torch.manual_seed(seed)
        self.inp = torch.nn.Linear(IN, hidden)
        self.moe = MoE(hidden_size=hidden,
                       expert=torch.nn.Linear(hidden, hidden),
                       num_experts=ep_size,
                       ep_size=ep_size,
                       k=1,
                       min_capacity=0,
                       drop_tokens=False,
                       use_rts=False)
        self.out = torch.nn.Linear(hidden, OUT)
        # The engine builds the groups later. With use_data_before_expert_parallelism (no model parallelism) the
        # expert-data-parallel groups are the consecutive blocks of world / ep_size ranks instead.
        replicas = dist.get_world_size() // ep_size
        self.expert_index = dist.get_rank() // replicas if data_before_expert else dist.get_rank() % ep_size
        with torch.no_grad():
            for param in self.moe.deepspeed_moe.experts.parameters():
                param.add_(0.1 * (self.expert_index + 1))

    def expert(self):
        return self.moe.deepspeed_moe.experts.deepspeed_experts[0]

    def dense(self):
        """The parameters every rank holds alike (gate included)."""
        return [self.inp.weight, self.inp.bias, self.moe.deepspeed_moe.gate.wg.weight, self.out.weight, self.out.bias]

    def forward(self, x):
        return self.out(self.moe(torch.relu(self.inp(x)))[0])


def fp64_gradients(model, inputs, targets, items=None):
    """fp64 gradients of the mean-square loss over the whole batch: ``(dense, experts)``, the dense
    parameters' in ``model.dense()`` order and ``experts[e] = [weight, bias]`` of every expert (gathered
    over the expert-parallel group). Each sample goes to the expert of highest gate probability,
    scaled by that probability, as the MoE layer does with top-1 gating. With ``items`` (a count per
    sample), the loss is the mean over items, a sample's squared error counted once per item."""
    from deepspeed.utils import groups
    group = groups._get_expert_parallel_group(model.moe.expert_group_name)
    assert dist.get_rank(group=group) == model.expert_index, "the expert-parallel groups are not the layout assumed"

    def gathered(tensor):
        tensor = tensor.detach().float().contiguous()
        parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group=group))]
        dist.all_gather(parts, tensor, group=group)
        return [part.double().requires_grad_(True) for part in parts]

    weights, biases = gathered(model.expert().weight), gathered(model.expert().bias)
    dense = [p.detach().double().requires_grad_(True) for p in model.dense()]
    inp_w, inp_b, gate_w, out_w, out_b = dense
    mixed = top1_moe(torch.relu(inputs.double() @ inp_w.T + inp_b), gate_w, map(linear, weights, biases))
    if items is None:
        torch.nn.functional.mse_loss(mixed @ out_w.T + out_b, targets.double()).backward()
    else:
        total, count = sample_items_loss_sum(mixed @ out_w.T + out_b, targets, items)
        (total / count).backward()
    return [p.grad for p in dense], [[w.grad, b.grad] for w, b in zip(weights, biases)]


def top1_moe(hidden, gate_weight, experts):
    """A top-1 MoE layer without dropped tokens, in the dtype of its arguments: each sample goes to the
    expert of highest gate probability (``experts``: functions of the hidden states, by global index; linear
    ones from ``linear``), its output scaled by that probability."""
    probs = torch.softmax(hidden @ gate_weight.T, dim=1)
    chosen = probs.argmax(dim=1)
    outputs = torch.stack([expert(hidden) for expert in experts], dim=1)
    return probs.gather(1, chosen[:, None]) * outputs[torch.arange(len(hidden)), chosen]


def linear(weight, bias):
    """A linear expert for ``top1_moe``."""
    return lambda hidden: hidden @ weight.T + bias


def fp64_norm(dense_grads, expert_grads):
    flat = [g.flatten() for g in dense_grads] + [g.flatten() for pair in expert_grads for g in pair]
    return float(torch.linalg.vector_norm(torch.cat(flat)))


def forget_expert_groups():
    """DeepSpeed keeps expert groups by name (``ep_size_1`` for every ep-1 layout) for the process's life:
    a worker whose cases build different layouts forgets them before each."""
    from deepspeed.utils import groups
    for table in (groups._EXPERT_PARALLEL_GROUP, groups._EXPERT_PARALLEL_GROUP_RANKS,
                  groups._EXPERT_DATA_PARALLEL_GROUP, groups._EXPERT_DATA_PARALLEL_GROUP_RANKS):
        table.clear()
    groups.expert_tensor_parallel_world_size = 1
