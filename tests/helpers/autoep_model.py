# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""A small network with one Mixtral-style MoE block, as AutoEP finds it in a Hugging Face model, and the way
back from AutoEP's layout to the original one (for an fp64 reference on the unconverted network).

``model.layers.0.mlp`` holds a router (``gate``, 4 experts, top 2, softmax, the chosen weights renormalised)
and the experts' fused 3-D weights (``gate_up_proj``: gate and up rows stacked; ``down_proj``), which is what
AutoEP's ``mixtral`` preset replaces. AutoEP renames the router ``router.gate`` and splits the experts into
``w1`` (gate rows), ``w3`` (up rows) and ``w2`` (down), each rank holding the experts of its expert-parallel
rank, consecutive. With ``dense_pair``, a dense MLP before the block (``pre_up``, ``pre_down``, with a residual)
gives AutoTP a column- and a row-parallel linear to split.
"""

import torch

import deepspeed.comm as dist

IN, HIDDEN, FFN, OUT = 8, 16, 24, 4
DENSE_FFN = 8  # the dense pair's inner width
EXPERTS, TOP_K = 4, 2


class MixtralConfig:
    """The attributes AutoEP's preset reads from a Hugging Face config."""
    model_type = "mixtral"
    num_local_experts = EXPERTS
    num_experts_per_tok = TOP_K
    hidden_size = HIDDEN
    intermediate_size = FFN


class FusedExperts(torch.nn.Module):

    def __init__(self):
        super().__init__()
        self.gate_up_proj = torch.nn.Parameter(torch.randn(EXPERTS, 2 * FFN, HIDDEN) * 0.3)
        self.down_proj = torch.nn.Parameter(torch.randn(EXPERTS, HIDDEN, FFN) * 0.3)


class MixtralBlock(torch.nn.Module):

    def __init__(self):
        super().__init__()
        self.gate = torch.nn.Linear(HIDDEN, EXPERTS, bias=False)
        self.experts = FusedExperts()

    def forward(self, hidden):
        tokens = hidden.reshape(-1, HIDDEN)
        weights, chosen = torch.topk(torch.softmax(self.gate(tokens), dim=-1), TOP_K, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        output = torch.zeros_like(tokens)
        for expert in range(EXPERTS):
            token, slot = (chosen == expert).nonzero(as_tuple=True)
            gate, up = (tokens[token] @ self.experts.gate_up_proj[expert].T).chunk(2, dim=-1)
            out = (torch.nn.functional.silu(gate) * up) @ self.experts.down_proj[expert].T
            output = output.index_add(0, token, out * weights[token, slot, None])
        return output.reshape(hidden.shape)


class MixtralNet(torch.nn.Module):
    """Linear, tanh, (with ``dense_pair``: a dense MLP with a residual,) the MoE block with a residual, linear:
    ``(batch, tokens, IN) -> (batch, tokens, OUT)``."""

    def __init__(self, seed=0, dense_pair=False):
        super().__init__()
        torch.manual_seed(seed)
        self.config = MixtralConfig()
        self.inp = torch.nn.Linear(IN, HIDDEN)
        self.model = torch.nn.Module()
        layer = torch.nn.Module()
        layer.mlp = MixtralBlock()
        self.model.layers = torch.nn.ModuleList([layer])
        self.out = torch.nn.Linear(HIDDEN, OUT)
        self.dense_pair = dense_pair
        if dense_pair:
            self.pre_up = torch.nn.Linear(HIDDEN, DENSE_FFN)
            self.pre_down = torch.nn.Linear(DENSE_FFN, HIDDEN)

    def forward(self, x):
        hidden = torch.tanh(self.inp(x))
        if self.dense_pair:
            hidden = hidden + self.pre_down(torch.tanh(self.pre_up(hidden)))
        return self.out(hidden + self.model.layers[0].mlp(hidden))


# Where AutoTP splits the dense pair (column-parallel ``pre_up``, row-parallel ``pre_down``): name -> dim.
SPLIT_DIMS = {"pre_up.weight": 0, "pre_up.bias": 0, "pre_down.weight": 1}


def original_layout(module, blocks=1):
    """The parameters of an AutoEP-converted module (``MixtralNet``, or any model with Mixtral's MoE blocks) by
    their names in the unconverted one, in fp64, the experts gathered over the expert-parallel group and the
    dense pair's slices, where AutoTP split it, over the tensor-parallel group (collective: every rank calls
    it). ``blocks``: how many MoE blocks AutoEP must have converted (an unconverted block would leave the
    names as they were, and the reference would check nothing of AutoEP's)."""
    from deepspeed.module_inject.auto_ep_layer import AutoEPMoELayer
    layers = {name: layer for name, layer in module.named_modules() if isinstance(layer, AutoEPMoELayer)}
    assert len(layers) == blocks, f"AutoEP converted {sorted(layers)}, not {blocks} MoE block(s)"
    params = {}
    for name, param in module.named_parameters():
        owner = next((prefix for prefix in layers if name.startswith(prefix + ".")), None)
        if owner is None:
            params[name] = param.detach().double()
        elif not name.startswith(owner + ".experts."):
            params[name.replace(owner + ".router.gate.", owner + ".gate.")] = param.detach().double()

    def gathered(weight, group, dim=0):
        parts = [torch.empty_like(weight.detach()) for _ in range(dist.get_world_size(group=group))]
        dist.all_gather(parts, weight.detach().contiguous(), group=group)
        return torch.cat(parts, dim=dim).double()

    split = getattr(module, "pre_up", None) is not None and module.pre_up.weight.shape[0] < DENSE_FFN
    if split:
        from deepspeed.utils import groups
        tp_group = groups.get_tensor_model_parallel_group()
        for name, dim in SPLIT_DIMS.items():
            params[name] = gathered(params[name], tp_group, dim)

    for prefix, layer in layers.items():
        experts, group = layer.experts, layer.ep_group
        params[prefix + ".experts.gate_up_proj"] = torch.cat(
            [gathered(experts.w1, group), gathered(experts.w3, group)], dim=1)
        params[prefix + ".experts.down_proj"] = gathered(experts.w2, group)
    return params


def fp64_gradients(weights, inputs, targets):
    """The fp64 gradients of the mean-square loss over the whole batch, of the unconverted ``MixtralNet``
    holding ``weights`` (``original_layout``'s names), by name."""
    reference = MixtralNet(dense_pair="pre_up.weight" in weights).double()
    reference.load_state_dict(weights)
    torch.nn.functional.mse_loss(reference(inputs.double()), targets.double()).backward()
    return {name: param.grad for name, param in reference.named_parameters()}
