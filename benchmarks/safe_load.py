#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""What loading checkpoints safely costs: ``engine.load_checkpoint`` of one ZeRO checkpoint with ``weights_only=True``
(the default: every file of the tag checked first, memory-mapped, then each loaded with the allowlist) and with
``weights_only=False`` (unchecked, as 0.19.8 loads), in turns on one CPU rank; and the check alone.

    python benchmarks/safe_load.py [--params 110e6] [--stage 2] [--pairs 3]
"""

import argparse
import glob
import os
import statistics
import tempfile
import time

from toolkit import tables
from toolkit.ports import free_port

WIDTH = 2048


def engine_of(params, stage):
    import torch
    import deepspeed
    layers = max(1, round(params / (WIDTH * WIDTH + WIDTH)))
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)])
    count = sum(p.numel() for p in model.parameters())  # before ZeRO-3 partitions them away
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {
            "type": "Adam",
            "params": {
                "lr": 1e-3,
                "torch_adam": True
            }
        },
        "zero_optimization": {
            "stage": stage
        },
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    engine.backward(engine(torch.randn(1, WIDTH)).square().mean())
    engine.step()
    return engine, count


def timed(fn):
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def one_rank_engine(description):
    """The command line's arguments (--params, --stage, --pairs), and the engine they ask for on one CPU rank, trained
    one step, with its parameter count."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--params", type=float, default=110e6)
    parser.add_argument("--stage", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_SIZE="1", MASTER_ADDR="127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    return (args, *engine_of(int(args.params), args.stage))


def main():
    args, engine, count = one_rank_engine(__doc__.splitlines()[0])
    from deepspeed.checkpoint import safe_load
    with tempfile.TemporaryDirectory(prefix="ds-safe-load-") as root:
        engine.save_checkpoint(root, tag="t")
        files = sorted(glob.glob(os.path.join(root, "t", "*.pt")))
        size = sum(os.path.getsize(path) for path in files)
        times = {"weights_only=True (default)": [], "weights_only=False (unchecked)": [], "the check alone": []}
        for _ in range(args.pairs):
            times["weights_only=False (unchecked)"].append(
                timed(lambda: engine.load_checkpoint(root, tag="t", weights_only=False)))
            times["weights_only=True (default)"].append(
                timed(lambda: engine.load_checkpoint(root, tag="t", weights_only=True)))
            times["the check alone"].append(timed(lambda: safe_load.refuse_unsafe_files(files)))
    unchecked = statistics.median(times["weights_only=False (unchecked)"])
    print(f"{count / 1e6:.0f}M parameters, ZeRO-{args.stage}, {len(files)} files, {size / 2**30:.2f} GiB; "
          f"{args.pairs} loads each, in turns")
    rows = [[name, " ".join(f"{t:.2f}" for t in values), f"{statistics.median(values) / unchecked:.2f}"]
            for name, values in times.items()]
    print("\n".join(
        tables.table(["load_checkpoint", "seconds", "median / unchecked"], rows, right=("median / unchecked", ))))


if __name__ == "__main__":
    main()
