# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Same global batch, two gradient-accumulation splits: do loss, grad norm and weights agree?

    deepspeed --num_gpus 2 --no_local_rank examples/gas_demo.py [--zero-stage 1] [--dtype fp32]

Each step trains one global batch of 16 samples, split per rank as (micro-batch 16/W x GAS 1) and
as (16/(4W) x GAS 4), from the same initial weights, and prints the loss and the engine's global
grad norm of both splits beside a plain fp64 PyTorch reference. Exit status 1 when the splits or the
reference disagree beyond the dtype's tolerance.
"""

import argparse
import copy
import sys

import torch

import deepspeed
import deepspeed.comm as dist

GLOBAL_BATCH = 16
STEPS = 3
LR = 0.1
# fp32: accumulation order differs between splits, ~1e-6 relative; bf16 keeps 8 bits of mantissa.
TOLERANCE = {"fp32": 1e-4, "bf16": 3e-2}


def make_model(seed=1234):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def make_batches(seed=4321):
    """One (inputs, targets) global batch per step; targets differ per sample so every micro-batch matters."""
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(GLOBAL_BATCH, 8, generator=gen), torch.randn(GLOBAL_BATCH, 4, generator=gen) * 3)
            for _ in range(STEPS)]


def ds_config(micro, gas, zero_stage, dtype):
    config = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": gas,
        "optimizer": {
            "type": "SGD",
            "params": {
                "lr": LR
            }
        },
        "zero_optimization": {
            "stage": zero_stage
        },
        "zero_allow_untested_optimizer": True,
        "gradient_clipping": 0.0,  # defaults to 1.0 since 0.19.3; off so the update is plain SGD
    }
    if dtype == "bf16":
        config["bf16"] = {"enabled": True}
    return config


def full_parameters(engine):
    """The engine's full weights as fp64 copies (ZeRO-3 shards gathered)."""
    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params, enabled=engine.zero_optimization_stage() == 3):
        return [p.detach().double().clone() for p in params]


def train_split(batches, micro, gas, zero_stage, dtype):
    """Train STEPS global batches with one split; return per-step (mean loss, grad norm) and the final weights."""
    world, rank = dist.get_world_size(), dist.get_rank()
    model = make_model()
    engine, *_ = deepspeed.initialize(model=model,
                                      model_parameters=model.parameters(),
                                      config=ds_config(micro, gas, zero_stage, dtype))
    per_rank = GLOBAL_BATCH // world
    history = []
    for inputs, targets in batches:
        x, y = inputs[rank * per_rank:(rank + 1) * per_rank], targets[rank * per_rank:(rank + 1) * per_rank]
        loss_sum = torch.zeros(1)
        for m in range(gas):
            xb = x[m * micro:(m + 1) * micro].to(engine.device, engine.module[0].weight.dtype)
            yb = y[m * micro:(m + 1) * micro].to(engine.device, engine.module[0].weight.dtype)
            loss = torch.nn.functional.mse_loss(engine(xb), yb)
            engine.backward(loss)
            engine.step()
            loss_sum += loss.detach().float().cpu()
        dist.all_reduce(loss_sum)
        norm = engine.get_global_grad_norm()
        history.append((loss_sum.item() / (gas * world), None if norm is None else float(norm)))
    weights = full_parameters(engine)
    engine.destroy()
    return history, weights


def train_reference(batches):
    """Plain PyTorch, fp64, one process, the whole global batch at once."""
    model = make_model().double()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    history = []
    for inputs, targets in batches:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs.double()), targets.double())
        loss.backward()
        norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
        optimizer.step()
        history.append((loss.item(), norm.item()))
    return history, [p.detach().clone() for p in model.parameters()]


def max_relative_difference(weights, reference):
    return max(((w - r).abs().max() / r.abs().max()).item() for w, r in zip(weights, reference))


def fmt(value):
    return "n/a" if value is None else f"{value:.6f}"


def compare_splits(zero_stage=1, dtype="fp32"):
    """Train both splits and the reference; return their per-step (loss, norm) and the weights' agreement."""
    world = dist.get_world_size()
    if GLOBAL_BATCH % (4 * world):
        raise ValueError(f"world size {world} must divide {GLOBAL_BATCH // 4}")
    batches = make_batches()
    per_rank = GLOBAL_BATCH // world
    splits = [(per_rank, 1), (per_rank // 4, 4)]
    runs = [train_split(copy.deepcopy(batches), micro, gas, zero_stage, dtype) for micro, gas in splits]
    ref_history, ref_weights = train_reference(batches)
    worst = max(max_relative_difference(weights, ref_weights) for _, weights in runs)
    return {
        "splits": [f"{micro}x{gas}" for micro, gas in splits],
        "histories": [history for history, _ in runs],
        "reference": ref_history,
        "max_weight_error": worst,
        "agree": worst <= TOLERANCE[dtype],
    }


def print_comparison(result, zero_stage, dtype):
    names, histories, reference = result["splits"], result["histories"], result["reference"]
    world = dist.get_world_size()
    print(f"\ndeepspeed {deepspeed.__version__}, {world} rank(s), ZeRO stage {zero_stage}, {dtype}, "
          f"global batch {GLOBAL_BATCH} = micro-batch x GAS x {world} ranks")
    header = ["step"] + [f"loss {n}" for n in names] + ["loss fp64"] + [f"norm {n}" for n in names] + ["norm fp64"]
    print(" | ".join(f"{h:>12}" for h in header))
    for step in range(STEPS):
        row = [str(step + 1)] + [fmt(history[step][0]) for history in histories] + [fmt(reference[step][0])]
        row += [fmt(history[step][1]) for history in histories] + [fmt(reference[step][1])]
        print(" | ".join(f"{cell:>12}" for cell in row))
    print(f"weights after {STEPS} steps: max relative difference from fp64 reference "
          f"{result['max_weight_error']:.2e} (tolerance {TOLERANCE[dtype]:.0e}): "
          f"{'AGREE' if result['agree'] else 'DISAGREE'}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--zero-stage", type=int, default=1, choices=[0, 1, 2, 3])
    parser.add_argument("--dtype", default="fp32", choices=sorted(TOLERANCE))
    args = parser.parse_args()

    deepspeed.init_distributed()
    result = compare_splits(args.zero_stage, args.dtype)
    if dist.get_rank() == 0:
        print_comparison(result, args.zero_stage, args.dtype)
    # Down together before exit: a rank whose communication threads still run at interpreter teardown aborts
    # ("terminate called without an active exception") while rank 0 is still printing.
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(0 if result["agree"] else 1)


if __name__ == "__main__":
    main()
