# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""One rank of benchmarks/reshard.py: saves or loads a checkpoint of a GPT-like model, through DeepSpeed (ZeRO-2, fp32,
AdamW) or through torch.distributed.checkpoint (FSDP2, AdamW), and writes what the load cost this rank to
``<out>/rank<r>.json``: seconds, and its resident memory before and at its peak during the load."""

import argparse
import datetime
import json
import os
import threading
import time
from pathlib import Path

import torch

SIZES = {  # hidden, layers, heads; vocabulary 32000, context 1024
    "20M": (256, 16, 4),
    "110M": (768, 12, 12),
    "336M": (1024, 24, 16),
}
VOCAB, CONTEXT = 32000, 1024


def gpt_model(size):
    """benchmarks/step_time.py's GPT-2, at one of SIZES."""
    from step_time import gpt2_model
    hidden, layers, heads = SIZES[size]
    torch.manual_seed(0)
    return gpt2_model(hidden, layers, heads, VOCAB, CONTEXT)


def tokens():
    return torch.randint(0, VOCAB, (1, 32), generator=torch.Generator().manual_seed(int(os.environ["RANK"])))


class PeakMemory:
    """This process's resident memory, sampled every 10 ms while the block runs: before it and its peak."""

    def __init__(self):
        self.before = self.peak = 0
        self.running = False

    @staticmethod
    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _sample(self):
        while self.running:
            self.peak = max(self.peak, self.rss())
            time.sleep(0.01)

    def __enter__(self):
        self.before = self.peak = self.rss()
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, self.rss())


def deepspeed_engine(size, pg_timeout):
    import deepspeed
    if pg_timeout:
        deepspeed.init_distributed(timeout=datetime.timedelta(seconds=pg_timeout))
    model = gpt_model(size)
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": 1e-4,
                "torch_adam": True
            }
        },
        "zero_optimization": {
            "stage": 2
        },
        "checkpoint": {
            "reshard_on_load": True
        },
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    return engine


def deepspeed_run(args, _world_size):
    import deepspeed.comm as dist
    engine = deepspeed_engine(args.size, args.pg_timeout)
    if args.save:
        engine.backward(engine(tokens()))
        engine.step()
        engine.save_checkpoint(args.checkpoint, tag="t")
        return None
    dist.barrier()
    with PeakMemory() as memory:
        started = time.perf_counter()
        load_path, _ = engine.load_checkpoint(args.checkpoint, tag="t")
        seconds = time.perf_counter() - started
    assert load_path is not None and engine.global_steps == 1, (load_path, engine.global_steps)
    return seconds, memory


def dcp_run(args, world_size):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.pg_timeout) if args.pg_timeout else None)
    mesh = init_device_mesh("cpu", (world_size, ))
    model = gpt_model(args.size)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if args.save:
        model(tokens()).backward()
        optimizer.step()
        model_state, optimizer_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=args.checkpoint)
        return None
    model_state, optimizer_state = get_state_dict(model, optimizer)  # lays out the optimizer's states to load into
    dist.barrier()
    with PeakMemory() as memory:
        started = time.perf_counter()
        state = {"model": model_state, "optimizer": optimizer_state}
        dcp.load(state, checkpoint_id=args.checkpoint)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
        seconds = time.perf_counter() - started
    return seconds, memory


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", choices=sorted(SIZES), required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--dcp", action="store_true")
    parser.add_argument("--save", action="store_true")
    parser.add_argument("--out", required=True)
    parser.add_argument("--pg-timeout", type=float, help="the process group's timeout, seconds")
    args = parser.parse_args()
    world_size, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    measured = (dcp_run if args.dcp else deepspeed_run)(args, world_size)
    if measured is not None:
        seconds, memory = measured
        Path(args.out, f"rank{rank}.json").write_text(
            json.dumps({
                "seconds": seconds,
                "rss_before": memory.before,
                "rss_peak": memory.peak
            }))


if __name__ == "__main__":
    main()
