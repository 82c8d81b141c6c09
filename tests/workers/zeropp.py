# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Rank worker (4 ranks): ZeRO++'s quantized communication on ZeRO-3, at several splits of one global batch of 16
(micro-batch x GAS per rank 4x1, 2x2, 1x4).

qgZ (``zero_quantized_gradients``) quantizes gradients to 4 bits only between nodes, qwZ
(``zero_quantized_weights``, ``zero_quantized_nontrainable_weights``) quantizes the weights it gathers or stores to 8
bits; both through DeepSpeed's quantizer, a CUDA op. On a CPU the worker runs upstream's own pure-torch implementation
of the same wire format, rounding as the CUDA kernel does (``helpers/torch_quantizer.py``), and sets ``LOCAL_SIZE``
to 2 so that the 4 ranks are 2 nodes of 2 and qgZ's two-stage all-to-all runs.

Each case trains one step of plain SGD without clipping, so the update over the learning rate is the gradient the
engine applied, and reports it against fp64 PyTorch's gradient at the weights each micro-batch's forward used
(recorded before each forward: the gathered, dequantized weights; without qwZ the weights themselves), with how far
those weights are from the weights, in quantization steps. Case names ``<path>_m<micro>_g<gas>``.
"""

import os

os.environ["LOCAL_SIZE"] = "2"  # the CPU accelerator's device count: 2 ranks a node, so 4 ranks are 2 nodes

import torch  # noqa: E402

import deepspeed  # noqa: E402
import deepspeed.comm as dist  # noqa: E402
from helpers.master_weights import zero_master_weights  # noqa: E402
from helpers.rank_cases import run_cases  # noqa: E402
from helpers.small_model import mse, sgd_config  # noqa: E402
from helpers.torch_quantizer import use_torch_quantizer  # noqa: E402

WIDTH, LAYERS, GLOBAL_BATCH, LR = 32, 3, 16, 0.1
SPLITS = [(4, 1), (2, 2), (1, 4)]
# path -> (the zero_optimization keys it turns on, the layer whose weights are frozen or None)
PATHS = {
    "qgz": (["zero_quantized_gradients"], None),
    "qwz": (["zero_quantized_weights"], None),
    "qwz_nontrainable": (["zero_quantized_nontrainable_weights"], 1),
    "qgz_qwz": (["zero_quantized_gradients", "zero_quantized_weights"], None),
}


def make_model(frozen):
    torch.manual_seed(1234)
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers[:-1])  # no Tanh after the last
    if frozen is not None:
        model[2 * frozen].requires_grad_(False)
    return model


def batch():
    gen = torch.Generator().manual_seed(4321)
    return torch.randn(GLOBAL_BATCH, WIDTH, generator=gen), torch.randn(GLOBAL_BATCH, WIDTH, generator=gen)


def linear_tensors(module):
    return [module.weight.detach().double().clone(), module.bias.detach().double().clone()]


def record_forward_weights(model):
    """Each Linear's (weight, bias) as its last forward saw them (ZeRO-3 gathers them just before), by module index."""
    seen = {}

    def hook(index):

        def record(module, args):
            seen[index] = linear_tensors(module)

        return record

    for index, module in enumerate(model):
        if isinstance(module, torch.nn.Linear):
            module.register_forward_pre_hook(hook(index))
    return seen


def reference_gradients(frozen, micro_batches, gas):
    """The fp64 gradient of the engine's loss: each micro-batch's loss over GAS at the weights its forward used,
    summed over the micro-steps and averaged over the ranks; by parameter name."""
    reference = make_model(frozen).double()
    total = {n: torch.zeros_like(p) for n, p in reference.named_parameters() if p.requires_grad}
    for (x, y), weights in micro_batches:
        with torch.no_grad():
            for index, (weight, bias) in weights.items():
                reference[index].weight.copy_(weight)
                reference[index].bias.copy_(bias)
        reference.zero_grad()
        (mse(reference(x.double()), y.double()) / gas).backward()
        for name, param in reference.named_parameters():
            if name in total:
                total[name] += param.grad
    for grad in total.values():
        dist.all_reduce(grad)
        grad /= dist.get_world_size()
    return total


def quantization_steps(weights, master):
    """How far the forward's weights are from ``master``, in steps of 8-bit symmetric quantization of each tensor
    (its largest magnitude / 128; a group's step is at most that)."""
    return max(
        float((seen - master[index][i]).abs().max() / (master[index][i].abs().max() / 128))
        for index, tensors in weights.items() for i, seen in enumerate(tensors))


def case(path, micro, gas):

    def run():
        use_torch_quantizer()
        keys, frozen = PATHS[path]
        model = make_model(frozen)
        initial = {i: linear_tensors(m) for i, m in enumerate(model) if isinstance(m, torch.nn.Linear)}
        config = {**sgd_config(micro, gas, 0.0, LR), "zero_optimization": {"stage": 3, **dict.fromkeys(keys, True)}}
        engine, _, _, _ = deepspeed.initialize(model=model,
                                               model_parameters=[p for p in model.parameters() if p.requires_grad],
                                               config=config)
        rank, per_rank = engine.global_rank, micro * gas
        inputs, targets = batch()
        seen = record_forward_weights(engine.module)
        before = zero_master_weights(engine)
        micro_batches = []
        for i in range(gas):
            start = rank * per_rank + i * micro
            x, y = inputs[start:start + micro], targets[start:start + micro]
            engine.backward(mse(engine(x), y))
            micro_batches.append(((x, y), {index: list(tensors) for index, tensors in seen.items()}))
            engine.step()
        after = zero_master_weights(engine)
        norm = engine.get_global_grad_norm()
        engine.destroy()

        expected = reference_gradients(frozen, micro_batches, gas)
        applied = {n: (before[n] - after[n]) / LR for n in expected}
        gap = torch.cat([(applied[n] - expected[n]).flatten() for n in expected])
        whole = torch.cat([expected[n].flatten() for n in expected])
        return {
            "update_error": float(gap.norm() / whole.norm()),
            "gradient_ratio": float(torch.cat([applied[n].flatten() for n in expected]).norm() / whole.norm()),
            "norm": None if norm is None else float(norm),
            "reference_norm": float(whole.norm()),
            "forward_weight_steps": max(quantization_steps(weights, initial) for _, weights in micro_batches),
        }

    return run


if __name__ == "__main__":
    run_cases({f"{p}_m{m}_g{g}": case(p, m, g) for p in PATHS for m, g in SPLITS})
