# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The mean over every labelled token of the global batch, whatever the micro-batch x GAS split.

    deepspeed --num_gpus 2 --no_local_rank examples/per_item_loss.py [--mode per_item|mean] [--zero-stage 1|2]

A tiny token model trains 3 steps on padded rows (1-12 labelled tokens of 12), split per rank as
micro-batch 8 x GAS 1 and as 2 x GAS 4 from the same weights. In ``per_item`` mode each micro-batch
passes the SUM of its tokens' losses with ``engine.backward(loss_sum, num_items=n)``; in ``mean`` mode
(DeepSpeed's default) its own mean. Prints how far each split's update is from fp64 PyTorch steps on the
global token mean: per_item agrees to fp32 rounding, mean mode is off by the split-dependent bias.
"""

import argparse
import copy

import torch

import deepspeed
import deepspeed.comm as dist

POSITIONS, FEATURES, GLOBAL_BATCH, STEPS, LR = 12, 8, 16, 3, 0.1
TOLERANCE = 1e-4  # fp32 rounding over 3 steps, as examples/gas_demo.py allows


def make_model(seed=1234):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def make_batch(step):
    """Padded rows: inputs, targets and the mask of labelled tokens (1-12 per row)."""
    gen = torch.Generator().manual_seed(100 + step)
    lengths = torch.randint(1, POSITIONS + 1, (GLOBAL_BATCH, ), generator=gen)
    inputs = torch.randn(GLOBAL_BATCH, POSITIONS, FEATURES, generator=gen)
    targets = torch.randn(GLOBAL_BATCH, POSITIONS, generator=gen) + lengths.view(-1, 1) / 4
    return inputs, targets, torch.arange(POSITIONS).view(1, -1) < lengths.view(-1, 1)


def token_loss_sum(model, inputs, targets, mask):
    """(sum of the labelled tokens' squared errors, how many there are)."""
    errors = (model(inputs).squeeze(-1) - targets)**2
    return (errors * mask).sum(), int(mask.sum())


def reference_weights():
    """fp64 SGD on the global token mean."""
    model = make_model().double()
    for step in range(STEPS):
        inputs, targets, mask = make_batch(step)
        model.zero_grad()
        total, count = token_loss_sum(model, inputs.double(), targets.double(), mask)
        (total / count).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= LR * p.grad
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def train(micro, gas, mode, zero_stage):
    model = copy.deepcopy(make_model())
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
        "gradient_clipping": 0.0,
        "loss_normalization": mode,
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    rank = dist.get_rank()
    for step in range(STEPS):
        inputs, targets, mask = (t[rank * micro * gas:(rank + 1) * micro * gas] for t in make_batch(step))
        for i in range(gas):
            part = slice(i * micro, (i + 1) * micro)
            total, n = token_loss_sum(engine, inputs[part], targets[part], mask[part])
            if mode == "per_item":
                engine.backward(total, num_items=n)  # the engine divides by the global batch's count
            else:
                engine.backward(total / n)  # this micro-batch's own mean
            engine.step()
    weights = torch.cat([p.detach().double().flatten() for p in engine.module.parameters()])
    engine.destroy()
    return weights


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["per_item", "mean"], default="per_item")
    parser.add_argument("--zero-stage", type=int, choices=[1, 2], default=2)
    args, _ = parser.parse_known_args()
    deepspeed.init_distributed()
    per_rank = GLOBAL_BATCH // dist.get_world_size()
    start = torch.cat([p.detach().double().flatten() for p in make_model().parameters()])
    want = reference_weights()
    errors = []
    for micro, gas in ((per_rank, 1), (per_rank // 4, 4)):
        got = train(micro, gas, args.mode, args.zero_stage)
        errors.append(((got - want).norm() / (want - start).norm()).item())
        if dist.get_rank() == 0:
            print(
                f"{args.mode} mode, micro-batch {micro} x GAS {gas}: the 3 steps' update is {errors[-1]:.1e} (relative) "
                "from the fp64 global token mean's",
                flush=True)
    if dist.get_rank() == 0:
        verdict = "AGREE" if max(errors) <= TOLERANCE else "DIFFER"
        why = ("" if args.mode == "per_item" else
               " (each micro-batch's own mean weighs its tokens by the split: --mode per_item removes that)")
        print(
            f"{args.mode} mode: largest update difference from the fp64 global token mean {max(errors):.1e} "
            f"(tolerance {TOLERANCE:.0e}): {verdict}{why}",
            flush=True)


if __name__ == "__main__":
    main()
