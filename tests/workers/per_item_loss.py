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

import torch  # noqa: E402

import deepspeed  # noqa: E402
import deepspeed.comm as dist  # noqa: E402
from helpers.master_weights import master_weights  # noqa: E402 (fp32 master weights of any engine path)
from toolkit.collectives import CollectiveCounter  # noqa: E402
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
    """fp64 SGD on the global item mean: the norm before clipping and the weights after every step (and
    the losses before each)."""
    model = torch.nn.Sequential(*copy.deepcopy(layers)).double()
    norms, weights, losses = [], [], []
    for step in range(STEPS):
        inputs, targets, mask = item_batch(step)
        model.zero_grad()
        total, count = item_loss_sum(model(inputs.double()), targets.double(), mask)
        losses.append((total / count).item())
        (total / count).backward()
        norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()])).item()
        coef = min(1.0, clip / (norm + 1e-6)) if clip > 0 else 1.0
        with torch.no_grad():
            for p in model.parameters():
                p -= LR * coef * p.grad
        norms.append(norm)
        weights.append({name: p.detach().clone() for name, p in model.named_parameters()})
    return norms, weights, losses


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
        weights.append(master_weights(engine))
    skipped = engine.skipped_steps
    engine.destroy()
    return norms, weights, (counters if count else None), skipped


def start_layers(extra):
    """The layers, rounded to the engine's dtype: its master weights start from the module's weights in
    that dtype, and so does the reference."""
    dtype = torch.bfloat16 if "bf16" in extra else torch.float16 if "fp16" in extra else torch.float32
    layers = make_layers()
    with torch.no_grad():
        for p in torch.nn.Sequential(*layers).parameters():
            p.copy_(p.to(dtype).float())
    return layers


def splits_case(extra, clip=0.0, mode="per_item"):
    """Per split: the norm error at every step and the update error after steps 1 and 3."""

    def run():
        extra_config = dict(extra, gradient_clipping=clip)
        layers = start_layers(extra)
        want_norms, want_weights, _ = reference(layers, clip)
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


def pipeline_train(micro, gas, extra, mode, layers):
    """2 stages (x the remaining ranks as DP), three train_batch() steps: per step the reported norm and
    loss, and this rank's stage weights."""
    from deepspeed.pipe import PipelineModule

    def loss_fn(output, labels):
        total, n = item_loss_sum(output, *labels)
        return (total, n) if mode == "per_item" else total / max(n, 1)

    module = PipelineModule(layers=copy.deepcopy(layers), num_stages=2, loss_fn=loss_fn, partition_method="uniform")
    engine, *_ = deepspeed.initialize(model=module,
                                      model_parameters=[p for p in module.parameters() if p.requires_grad],
                                      config=config_of(micro, gas, extra))
    dp_rank = engine.grid.get_data_parallel_id()
    dtype = next(engine.module.parameters()).dtype

    def batches_of(step):
        inputs, targets, mask = item_batch(step)
        share = slice(dp_rank * micro * gas, (dp_rank + 1) * micro * gas)
        inputs, targets, mask = inputs[share].to(dtype), targets[share], mask[share]
        return [(inputs[i * micro:(i + 1) * micro], (targets[i * micro:(i + 1) * micro],
                                                     mask[i * micro:(i + 1) * micro])) for i in range(gas)]

    # eval_batch() reports the same global item mean as the first train_batch() (same weights and data).
    eval_loss = float(engine.eval_batch(data_iter=iter(batches_of(0))))
    norms, losses, weights, counters = [], [], [], []
    for step in range(STEPS):
        with CollectiveCounter() as counter:
            loss = engine.train_batch(data_iter=iter(batches_of(step)))
        counters.append({"collectives": len(counter.calls), "host_reads": counter.host_reads})
        losses.append(float(loss))
        norm = engine.get_global_grad_norm()
        norms.append(None if norm is None else float(norm))
        weights.append(master_weights(engine))
    skipped = engine.skipped_steps
    engine.destroy()
    return norms, [eval_loss] + losses, weights, counters, skipped


def pipeline_case(extra, clip=0.0, mode="per_item"):
    """Per split of the DP ranks' share: norm and reported loss errors at every step, update errors after
    steps 1 and 3 (worst over both stages' tensors)."""

    def run():
        layers = start_layers(extra)
        want_norms, want_weights, want_losses = reference(layers, clip)
        start = {name: p.detach().double() for name, p in torch.nn.Sequential(*layers).named_parameters()}
        rows = {}
        for micro, gas in SPLITS[dist.get_world_size() // 2]:
            norms, losses, weights, counters, skipped = pipeline_train(micro, gas, dict(extra, gradient_clipping=clip),
                                                                       mode, layers)
            # A stage holds its layers under their indices in the whole model, as the reference names them.
            errors = torch.tensor([
                update_error(weights[0], {name: want_weights[0][name]
                                          for name in weights[0]}, start),
                update_error(weights[2], {name: want_weights[2][name]
                                          for name in weights[2]}, want_weights[1])
            ])
            dist.all_reduce(errors, op=dist.ReduceOp.MAX)
            # Stages differ in what they read back (the last computes the loss): the most of any rank.
            counts = torch.tensor([[c["collectives"], c["host_reads"]] for c in counters])
            dist.all_reduce(counts, op=dist.ReduceOp.MAX)
            rows[f"{micro}x{gas}"] = {
                "norm_errors":
                [None if got is None else abs(got - want) / want for got, want in zip(norms, want_norms)],
                # eval_batch() before the first step, then train_batch() at each step
                "loss_errors": [abs(got - want) / want for got, want in zip(losses, want_losses[:1] + want_losses)],
                "update_errors": errors.tolist(),
                "collectives": counts[:, 0].tolist(),
                "host_reads": counts[:, 1].tolist(),
                "skipped_steps": skipped,
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


def refused_pipeline_loss_fn():
    """A per_item pipeline whose loss_fn returns a mean (no count): train_batch() names the contract. One
    stage, so every rank computes the loss (with two, the first would wait for the failed last)."""
    from deepspeed.pipe import PipelineModule
    module = PipelineModule(layers=make_layers(), num_stages=1, loss_fn=torch.nn.MSELoss(), partition_method="uniform")
    engine, *_ = deepspeed.initialize(model=module,
                                      model_parameters=module.parameters(),
                                      config=config_of(4, 1, PER_ITEM_ZERO1))
    inputs, targets, _ = item_batch(0)
    try:
        return error_of(lambda: engine.train_batch(data_iter=iter([(inputs[:4], targets[:4])])))
    finally:
        engine.destroy()


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


def no_items_anywhere(extra):
    """Every micro-batch of every rank empty: the step is skipped (weights unchanged, no nan)."""

    def run():
        model = torch.nn.Sequential(*make_layers())
        engine, *_ = deepspeed.initialize(model=model,
                                          model_parameters=model.parameters(),
                                          config=config_of(2, 2, extra))

        def weights():
            return master_weights(engine)

        before = weights()
        inputs, targets, mask = item_batch(0)
        inputs = inputs.to(next(engine.module.parameters()).dtype)
        for i in range(2):
            total, n = item_loss_sum(engine(inputs[2 * i:2 * i + 2]), targets[2 * i:2 * i + 2],
                                     mask[2 * i:2 * i + 2] & False)
            engine.backward(total, num_items=n)
            engine.step()
        after = weights()
        unchanged = all(torch.equal(before[name], after[name]) for name in before)
        result = {"unchanged": unchanged, "skipped_steps": engine.skipped_steps, "norm": engine.get_global_grad_norm()}
        engine.destroy()
        return result

    return run


# Per-rank item counts (rank 0, rank 1) around the exact-integer limits of bf16 (256), fp16 (2048) and
# fp32 (2**24), and counts above them, whose sums a bucket of that dtype cannot hold.
RIDING_COUNTS = [(0, 0), (1, 2), (255, 2), (257, 1023), (2047, 2049), (1_000_003, 999_999), (2**24 - 1, 2**24 - 1),
                 (2**30 + 128, 3)]


def count_rides_in_the_bucket(ranks_beyond_digits=None):
    """Without ZeRO the step's item count rides in the first gradient bucket's all-reduce as digits small
    enough to sum exactly in the bucket's dtype: per dtype and count pair, the count the engine takes
    from one bucket all-reduce, against the exact sum. With ``ranks_beyond_digits`` the group is reported
    that large (more ranks than a bf16 digit can sum exactly), so the count goes alone first."""

    def run():
        model = torch.nn.Sequential(*make_layers())
        engine, *_ = deepspeed.initialize(model=model,
                                          model_parameters=model.parameters(),
                                          config=config_of(2, 1, PER_ITEM))
        group, rank = None, dist.get_rank()
        world_size = dist.get_world_size
        if ranks_beyond_digits:
            dist.get_world_size = lambda group=None: ranks_beyond_digits
        rows = []
        try:
            for dtype in (torch.float32, torch.float16, torch.bfloat16):
                for counts in RIDING_COUNTS:
                    engine._items_to_reduce = torch.tensor(float(counts[rank]))
                    with CollectiveCounter() as counter:
                        engine.allreduce_bucket([torch.zeros(3, dtype=dtype)], group)
                    rows.append({
                        "dtype": str(dtype),
                        "counts": counts,
                        "items": engine._items_of_step.item(),
                        "collectives": len(counter.calls)
                    })
        finally:
            dist.get_world_size = world_size
            engine.destroy()
        return rows

    return run


PER_ITEM = {"loss_normalization": "per_item"}
PER_ITEM_ZERO1 = dict(PER_ITEM, zero_optimization={"stage": 1})
BF16 = {"bf16": {"enabled": True}}
FP16_DYNAMIC = {"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 8}}
# The gradients of a loss sum are as many times larger as the items it sums: with every item of a step on
# one rank (a pipeline without DP), or summed over the ranks before the division (ZeRO stage 0's fp16
# all-reduce), a loss scale of 2**8 overflows fp16, and dynamic scaling settles lower after skipped
# steps. Starting lower skips none (docs/guides/per_item_loss.md).
FP16_DYNAMIC_SUMS = {"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 2}}
OFFLOAD = {"offload_optimizer": {"device": "cpu"}}
# bf16 with fp32 gradient accumulation: BF16_Optimizer at ZeRO stage 1.
BF16_OPTIMIZER = dict(BF16, data_types={"grad_accum_dtype": "fp32"})

CASES = {
    "zero1_fp32":
    splits_case(PER_ITEM_ZERO1),
    "zero2_fp32_clip":
    splits_case(dict(PER_ITEM, zero_optimization={"stage": 2}), clip=0.5),
    "zero1_fp32_allreduce_sum":
    splits_case(dict(PER_ITEM_ZERO1, gradient_allreduce_op="sum")),
    "zero2_bf16_clip":
    splits_case(dict(PER_ITEM, zero_optimization={"stage": 2}, **BF16), clip=0.5),
    "zero1_fp16_dynamic":
    splits_case(dict(PER_ITEM_ZERO1, **FP16_DYNAMIC)),
    "zero2_offload_fp32_clip":
    splits_case(dict(PER_ITEM, zero_optimization=dict(stage=2, **OFFLOAD)), clip=0.5),
    "zero3_fp32_clip":
    splits_case(dict(PER_ITEM, zero_optimization={"stage": 3}), clip=0.5),
    "zero3_bf16_clip":
    splits_case(dict(PER_ITEM, zero_optimization={"stage": 3}, **BF16), clip=0.5),
    "zero3_fp16_dynamic":
    splits_case(dict(PER_ITEM, zero_optimization={"stage": 3}, **FP16_DYNAMIC)),
    "zero3_offload_fp32_clip":
    splits_case(dict(PER_ITEM, zero_optimization=dict(stage=3, **OFFLOAD)), clip=0.5),
    "zero1_fp32_mean_mode":
    splits_case({"zero_optimization": {
        "stage": 1
    }}, mode="mean"),
    "zero2_bf16_clip_mean_mode":
    splits_case(dict(zero_optimization={"stage": 2}, **BF16), clip=0.5, mode="mean"),
    "zero3_fp32_clip_mean_mode":
    splits_case({"zero_optimization": {
        "stage": 3
    }}, clip=0.5, mode="mean"),
    "zero0_fp32":
    splits_case(PER_ITEM),
    "zero0_fp32_clip":
    splits_case(PER_ITEM, clip=0.5),
    "zero0_fp32_allreduce_sum":
    splits_case(dict(PER_ITEM, gradient_allreduce_op="sum")),
    "zero0_bf16_clip":
    splits_case(dict(PER_ITEM, **BF16), clip=0.5),
    "zero0_fp16_dynamic":
    splits_case(dict(PER_ITEM, **FP16_DYNAMIC_SUMS)),
    "zero1_bf16_fp32_accumulation_clip":
    splits_case(dict(PER_ITEM_ZERO1, **BF16_OPTIMIZER), clip=0.5),
    "zero0_fp32_mean_mode":
    splits_case({}, mode="mean"),
    "zero1_bf16_fp32_accumulation_clip_mean_mode":
    splits_case(dict(zero_optimization={"stage": 1}, **BF16_OPTIMIZER), clip=0.5, mode="mean"),
    "zero0_bf16_clip_mean_mode":
    splits_case(BF16, clip=0.5, mode="mean"),
    "zero0_fp16_dynamic_mean_mode":
    splits_case(FP16_DYNAMIC_SUMS, mode="mean"),
    "count_rides_in_the_bucket":
    count_rides_in_the_bucket(),
    "count_goes_alone_beyond_exact_digits":
    count_rides_in_the_bucket(ranks_beyond_digits=257),
    "no_items_anywhere":
    no_items_anywhere(PER_ITEM_ZERO1),
    "no_items_anywhere_zero0":
    no_items_anywhere(PER_ITEM),
    "no_items_anywhere_zero0_bf16":
    no_items_anywhere(dict(PER_ITEM, **BF16)),
    "no_items_anywhere_zero3":
    no_items_anywhere(dict(PER_ITEM, zero_optimization={"stage": 3})),
    "refuses_bad_value":
    refused_config({"loss_normalization": "token"}),
    "refuses_backward_without_num_items":
    refused_backward(PER_ITEM_ZERO1),
    "refuses_num_items_in_mean_mode":
    refused_backward({"zero_optimization": {
        "stage": 1
    }}, num_items=3),
    # Last: a pipeline's grid stays in deepspeed.utils.groups for the process's lifetime.
    "pipe2_zero1_fp32":
    pipeline_case(PER_ITEM_ZERO1),
    "pipe2_zero1_fp32_clip":
    pipeline_case(PER_ITEM_ZERO1, clip=0.5),
    "pipe2_zero1_fp16_dynamic":
    pipeline_case(dict(PER_ITEM_ZERO1, **FP16_DYNAMIC_SUMS)),
    "pipe2_zero1_fp32_mean_mode":
    pipeline_case({"zero_optimization": {
        "stage": 1
    }}, mode="mean"),
    "pipe2_fp32_clip":
    pipeline_case(PER_ITEM, clip=0.5),
    "pipe2_bf16_clip":
    pipeline_case(dict(PER_ITEM, **BF16), clip=0.5),
    "pipe2_fp32_clip_mean_mode":
    pipeline_case({}, clip=0.5, mode="mean"),
    "refuses_pipeline_loss_fn_without_count":
    refused_pipeline_loss_fn,
    # Last: torch_autocast's state is process-wide from the first engine that enables it.
    "refuses_zero0_torch_autocast_fp16":
    refused_config(dict(PER_ITEM, torch_autocast={
        "enabled": True,
        "dtype": "fp16"
    })),
}

if __name__ == "__main__":
    from deepspeed.accelerator import get_accelerator
    get_accelerator().is_fp16_supported = lambda: True  # the engine's fp16 paths are device-independent
    run_cases(CASES)
