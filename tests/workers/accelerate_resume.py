# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Rank side of tests/test_accelerate_resume.py: accelerate's own loop (``prepare``, ``accumulate``, ``backward``,
``save_state`` / ``load_state``) trains a tiny Llama with DeepSpeed from the start and saves its state, or loads
another launch's state on this launch's number of processes and trains the rest.

``--root DIR``: the model is saved under DIR/model (once, by the first launch); each run's states under
DIR/zero<N>-on<world size>. Cases: ``uninterrupted/zero<N>`` trains STEPS steps and saves after SAVE_STEPS;
``resume-from<W>/zero<N>`` loads DIR/zero<N>-on<W>'s state, skips the micro-batches it trained, and trains to STEPS.
Every step trains the same GLOBAL_BATCH rows whatever the number of processes (GAS set to keep it); the rows are
unpadded, so the mean of the micro-batches' token means is the global one on any split. Each process reads its own
share of every step's rows: accelerate takes DeepSpeed's processes on a CPU for one each (its backend detection
looks for a GPU) and would give every one of them all the rows; on GPUs its prepared loader shards them so.
"""

import argparse
import os
from pathlib import Path

import torch  # noqa: E402

import deepspeed.comm as dist  # noqa: E402
from helpers.rank_cases import run_cases  # noqa: E402
from hf_training import batches, tiny_models  # noqa: E402
from hf_training.trainer_run import full_fp32_weights, process_state_reset  # noqa: E402

STEPS, SAVE_STEPS, MICRO_BATCH = 4, 2, 2
LR = 1e-2


def ds_config(stage, gas):
    """What an accelerate user writes: the optimizer and schedule in the DeepSpeed config, resharding on load."""
    return {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": 1.0,
        "zero_optimization": {
            "stage": stage
        },
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": LR,
                "weight_decay": 0.01,
                "torch_adam": True
            }
        },
        "scheduler": {
            "type": "WarmupDecayLR",
            "params": {
                "warmup_min_lr": 0.0,
                "warmup_max_lr": LR,
                "warmup_num_steps": 1,
                "total_num_steps": STEPS
            }
        },
        "checkpoint": {
            "reshard_on_load": True
        },
    }


def own_rows(rows, world, gas):
    """This process's micro-batches of every step: its MICRO_BATCH x ``gas`` rows of each step's GLOBAL_BATCH."""
    share = MICRO_BATCH * gas
    rank = dist.get_rank()
    return [
        row for step in range(len(rows) // batches.GLOBAL_BATCH)
        for row in batches.step_rows(rows, step)[rank * share:(rank + 1) * share]
    ]


def train(root, stage, writer=None):
    from accelerate import Accelerator
    from accelerate.utils import DeepSpeedPlugin, DummyOptim, DummyScheduler

    world = dist.get_world_size()
    gas = batches.GLOBAL_BATCH // (MICRO_BATCH * world)
    rows = batches.make_rows(padded=False, steps=STEPS)
    with process_state_reset():
        plugin = DeepSpeedPlugin(hf_ds_config=ds_config(stage, gas), gradient_accumulation_steps=gas)
        accelerator = Accelerator(deepspeed_plugin=plugin)
        model = tiny_models.load(tiny_models.saved_once("llama", root))
        optimizer = DummyOptim(model.parameters())
        loader = torch.utils.data.DataLoader(batches.Rows(own_rows(rows, world, gas)),
                                             batch_size=MICRO_BATCH,
                                             shuffle=False)
        model, optimizer, scheduler = accelerator.prepare(model, optimizer, DummyScheduler(optimizer))
        step = 0
        if writer is not None:
            accelerator.load_state(str(Path(root) / f"zero{stage}-on{writer}"))
            step = SAVE_STEPS
            loader = accelerator.skip_first_batches(loader, SAVE_STEPS * gas)
        resumed_at = model.global_steps
        initial = full_fp32_weights(model).tolist() if writer is None else None
        for batch in loader:
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                step += 1
                if writer is None and step == SAVE_STEPS:
                    accelerator.save_state(str(Path(root) / f"zero{stage}-on{world}"))
        result = {
            "resumed_at": resumed_at,
            "global_step": model.global_steps,
            "lr": scheduler.get_last_lr()[0],
            "initial": initial,
            "weights": full_fp32_weights(model).tolist(),
        }
        accelerator.free_memory()
    return result


if __name__ == "__main__":
    # What `accelerate launch --use_deepspeed` sets: accelerate then takes this launch's processes as DeepSpeed's
    # (else each process counts itself alone and reads every batch).
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--stages", default="2,3")
    parser.add_argument("--uninterrupted", action="store_true", help="train from the start and save")
    parser.add_argument("--resume-from", type=int, help="load the state written on this many processes")
    args, _ = parser.parse_known_args()
    named = {}
    for stage in (int(s) for s in args.stages.split(",")):
        if args.uninterrupted:
            named[f"uninterrupted/zero{stage}"] = lambda stage=stage: train(args.root, stage)
        if args.resume_from:
            named[f"resume-from{args.resume_from}/zero{stage}"] = lambda stage=stage: train(
                args.root, stage, args.resume_from)
    run_cases(named)
