# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Rank worker: ``"loss_normalization": "per_item"`` against the fp64 mean over every item of the
global batch, at several micro-batch x GAS splits, and the same data in the default mean mode.

Each sample has 12 positions of which 0-12 carry a label (padding masked); an item is a labelled
position. In per_item mode each micro-batch calls ``engine.backward(loss_sum, num_items=n)``; in mean
mode ``engine.backward(loss_sum / n)`` (each micro-batch's own mean, what users pass today). Three SGD
steps on three global batches; per split and step: the reported grad norm's relative error and the
weights' update error (relative, worst tensor) against plain fp64 PyTorch on the global item mean.
"""

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import deepspeed  # noqa: E402
import deepspeed.comm as dist  # noqa: E402
from deepspeed.utils import safe_get_full_fp32_param  # noqa: E402
from helpers.collectives import CollectiveCounter  # noqa: E402
from helpers.rank_cases import run_cases  # noqa: E402
from helpers.small_model import IN, OUT, make_layers, sgd_config  # noqa: E402

LR = 0.1
POSITIONS = 12
GLOBAL_BATCH = 32
STEPS = 3
SPLITS = {  # world size -> (micro-batch, GAS) per rank
    1: [(32, 1), (8, 4), (2, 16)],
    2: [(16, 1), (8, 2), (4, 4), (2, 8)],
    4: [(8, 1), (4, 2), (2, 4), (1, 8)],
}
# Samples without a single labelled position: with micro-batches of 2 (or 1), one micro-batch of rank 0
# holds no item at all.
EMPTY_SAMPLES = (6, 7)


def item_batch(step):
    """Inputs, targets and the label mask of one global batch: 1-12 labelled positions per sample (none
    in EMPTY_SAMPLES), so per-micro-batch means and the global item mean differ by O(1)."""
    gen = torch.Generator().manual_seed(1000 + step)
    inputs = torch.randn(GLOBAL_BATCH, POSITIONS, IN, generator=gen)
    targets = torch.randn(GLOBAL_BATCH, POSITIONS, OUT, generator=gen) * 3
    # Long rows learn a different target than short ones, so micro-batches' means weigh them differently.
    counts = torch.randint(1, POSITIONS + 1, (GLOBAL_BATCH, ), generator=gen)
    counts[list(EMPTY_SAMPLES)] = 0
    targets += counts.view(-1, 1, 1).float() / 2
    mask = torch.arange(POSITIONS).view(1, -1) < counts.view(-1, 1)
    return inputs, targets, mask


def item_loss_sum(output, target, mask):
    """(sum of the labelled positions' losses, their count): an item's loss is its squared error, mean
    over the outputs."""
    per_item = ((output.float() - target.float())**2).mean(dim=-1)
    return (per_item * mask).sum(), int(mask.sum())


def reference(layers, clip):
    """fp64 SGD on the global item mean: the norm before clipping and the weights after every step."""
    model = torch.nn.Sequential(*copy.deepcopy(layers)).double()
    norms, weights = [], []
    for step in range(STEPS):
        inputs, targets, mask = item_batch(step)
        model.zero_grad()
        total, count = item_loss_sum(model(inputs.double()), targets.double(), mask)
        (total / count).backward()
        norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()])).item()
        coef = min(1.0, clip / (norm + 1e-6)) if clip > 0 else 1.0
        with torch.no_grad():
            for p in model.parameters():
                p -= LR * coef * p.grad
        norms.append(norm)
        weights.append({name: p.detach().clone() for name, p in model.named_parameters()})
    return norms, weights


def config_of(micro, gas, extra):
    return dict(sgd_config(micro, gas, 0.0, LR), **copy.deepcopy(extra))


def update_error(got, want, start):
    """Worst relative error of the update (weights minus the start), over the tensors."""
    return max(((got[name] - want[name]).abs().max() / (want[name] - start[name]).abs().max()).item() for name in want)


def train(micro, gas, extra, mode, count=False):
    """Three steps at one split; per step the reported norm and the weights (every rank holds all), and
    with ``count`` the reducing collectives and host reads of the steps."""
    layers = make_layers()
    model = torch.nn.Sequential(*copy.deepcopy(layers))
    engine, *_ = deepspeed.initialize(model=model,
                                      model_parameters=model.parameters(),
                                      config=config_of(micro, gas, extra))
    dtype = next(engine.module.parameters()).dtype
    rank = dist.get_rank()
    norms, weights, counters = [], [], []
    for step in range(STEPS):
        inputs, targets, mask = item_batch(step)
        share = slice(rank * micro * gas, (rank + 1) * micro * gas)
        inputs, targets, mask = inputs[share], targets[share], mask[share]
        with CollectiveCounter() as counter:
            for i in range(gas):
                part = slice(i * micro, (i + 1) * micro)
                total, n = item_loss_sum(engine(inputs[part].to(dtype)), targets[part], mask[part])
                if mode == "per_item":
                    engine.backward(total, num_items=n)
                else:
                    engine.backward(total / max(n, 1))
                engine.step()
        counters.append({"collectives": len(counter.calls), "host_reads": counter.host_reads})
        norm = engine.get_global_grad_norm()
        norms.append(None if norm is None else float(norm))
        # The fp32 master weights (bf16/fp16 modules hold rounded copies).
        weights.append({name: safe_get_full_fp32_param(p).double() for name, p in engine.module.named_parameters()})
    skipped = engine.skipped_steps
    engine.destroy()
    return norms, weights, (counters if count else None), skipped


def splits_case(extra, clip=0.0, mode="per_item"):
    """Per split: the norm error at every step and the update error after steps 1 and 3."""

    def run():
        extra_config = dict(extra, gradient_clipping=clip)
        # The engine's master weights start from the module's weights in its dtype: so does the reference.
        dtype = torch.bfloat16 if "bf16" in extra else torch.float16 if "fp16" in extra else torch.float32
        layers = make_layers()
        with torch.no_grad():
            for p in torch.nn.Sequential(*layers).parameters():
                p.copy_(p.to(dtype).float())
        want_norms, want_weights = reference(layers, clip)
        start = {name: p.detach().double() for name, p in torch.nn.Sequential(*layers).named_parameters()}
        rows = {}
        for micro, gas in SPLITS[dist.get_world_size()]:
            norms, weights, counters, skipped = train(micro, gas, extra_config, mode, count=True)
            rows[f"{micro}x{gas}"] = {
                "norm_errors":
                [None if got is None else abs(got - want) / want for got, want in zip(norms, want_norms)],
                "update_errors": [
                    update_error(weights[0], want_weights[0], start),
                    update_error(weights[2], want_weights[2], want_weights[1])
                ],
                "collectives": [c["collectives"] for c in counters],
                "host_reads": [c["host_reads"] for c in counters],
                "skipped_steps":
                skipped,
            }
        return rows

    return run


def error_of(action):
    try:
        action()
    except Exception as err:  # the test checks the type and message
        return {"type": type(err).__name__, "message": str(err)}
    return None


def refused_config(extra):
    """The error deepspeed.initialize raises for a config (None: it accepted it)."""

    def run():
        model = torch.nn.Sequential(*make_layers())
        return error_of(lambda: deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=config_of(4, 1, extra)))

    return run


def refused_pipeline():
    from deepspeed.pipe import PipelineModule
    module = PipelineModule(layers=make_layers(), num_stages=2, loss_fn=torch.nn.MSELoss(), partition_method="uniform")
    return error_of(lambda: deepspeed.initialize(
        model=module, model_parameters=module.parameters(), config=config_of(4, 1, PER_ITEM_ZERO1)))


def refused_backward(extra, **backward_kwargs):
    """The error engine.backward raises for these arguments."""

    def run():
        model = torch.nn.Sequential(*make_layers())
        engine, *_ = deepspeed.initialize(model=model,
                                          model_parameters=model.parameters(),
                                          config=config_of(4, 1, extra))
        inputs, targets, mask = item_batch(0)
        total, _ = item_loss_sum(engine(inputs[:4]), targets[:4], mask[:4])
        try:
            return error_of(lambda: engine.backward(total, **backward_kwargs))
        finally:
            engine.destroy()

    return run


def no_items_anywhere():
    """Every micro-batch of every rank empty: the step is skipped (weights unchanged, no nan)."""
    model = torch.nn.Sequential(*make_layers())
    engine, *_ = deepspeed.initialize(model=model,
                                      model_parameters=model.parameters(),
                                      config=config_of(2, 2, PER_ITEM_ZERO1))
    before = {name: p.detach().clone() for name, p in engine.module.named_parameters()}
    inputs, targets, mask = item_batch(0)
    for i in range(2):
        total, n = item_loss_sum(engine(inputs[2 * i:2 * i + 2]), targets[2 * i:2 * i + 2],
                                 mask[2 * i:2 * i + 2] & False)
        engine.backward(total, num_items=n)
        engine.step()
    unchanged = all(torch.equal(before[name], p.detach()) for name, p in engine.module.named_parameters())
    result = {"unchanged": unchanged, "skipped_steps": engine.skipped_steps, "norm": engine.get_global_grad_norm()}
    engine.destroy()
    return result


PER_ITEM = {"loss_normalization": "per_item"}
PER_ITEM_ZERO1 = dict(PER_ITEM, zero_optimization={"stage": 1})
BF16 = {"bf16": {"enabled": True}}
FP16_DYNAMIC = {"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 8}}
OFFLOAD = {"offload_optimizer": {"device": "cpu"}}

CASES = {
    "zero1_fp32": splits_case(PER_ITEM_ZERO1),
    "zero2_fp32_clip": splits_case(dict(PER_ITEM, zero_optimization={"stage": 2}), clip=0.5),
    "zero1_fp32_allreduce_sum": splits_case(dict(PER_ITEM_ZERO1, gradient_allreduce_op="sum")),
    "zero2_bf16_clip": splits_case(dict(PER_ITEM, zero_optimization={"stage": 2}, **BF16), clip=0.5),
    "zero1_fp16_dynamic": splits_case(dict(PER_ITEM_ZERO1, **FP16_DYNAMIC)),
    "zero2_offload_fp32_clip": splits_case(dict(PER_ITEM, zero_optimization=dict(stage=2, **OFFLOAD)), clip=0.5),
    "zero1_fp32_mean_mode": splits_case({"zero_optimization": {
        "stage": 1
    }}, mode="mean"),
    "zero2_bf16_clip_mean_mode": splits_case(dict(zero_optimization={"stage": 2}, **BF16), clip=0.5, mode="mean"),
    "no_items_anywhere": no_items_anywhere,
    "refuses_bad_value": refused_config({"loss_normalization": "token"}),
    "refuses_zero0": refused_config(PER_ITEM),
    "refuses_zero3": refused_config(dict(PER_ITEM, zero_optimization={"stage": 3})),
    "refuses_backward_without_num_items": refused_backward(PER_ITEM_ZERO1),
    "refuses_num_items_in_mean_mode": refused_backward({"zero_optimization": {
        "stage": 1
    }}, num_items=3),
    # Last: the pipeline grid stays in deepspeed.utils.groups for the process's lifetime.
    "refuses_pipeline": refused_pipeline,
}

if __name__ == "__main__":
    from deepspeed.accelerator import get_accelerator
    get_accelerator().is_fp16_supported = lambda: True  # the engine's fp16 paths are device-independent
    run_cases(CASES)
