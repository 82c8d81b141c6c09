# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Rank side of tests/test_hf_resume.py: the Hugging Face Trainer trains from the start and saves, or resumes another
launch's checkpoint (``trainer.train(resume_from_checkpoint=...)``) on this launch's number of processes.

``--root DIR``: the tiny model is saved under DIR/model (once, by the first launch) and each run's checkpoints under
DIR/<stage>-on<world size>. Cases: ``uninterrupted/zero<N>`` trains from the start and saves;
``resume-from<W>/zero<N>`` resumes DIR/zero<N>-on<W>/checkpoint-<SAVE_STEPS>.
"""

import argparse
from pathlib import Path

import deepspeed.comm as dist  # noqa: E402
from helpers.rank_cases import run_cases  # noqa: E402
from hf_training import batches, resume_run, tiny_models  # noqa: E402


def case(root, stage, writer=None):

    def run():
        world = dist.get_world_size()
        rows = batches.make_rows(padded=True, steps=resume_run.STEPS)
        resume_from = None
        if writer is not None:
            resume_from = str(Path(root) / f"zero{stage}-on{writer}" / f"checkpoint-{resume_run.SAVE_STEPS}")
        output_dir = Path(root) / (f"zero{stage}-on{world}"
                                   if writer is None else f"zero{stage}-from{writer}-on{world}")
        return resume_run.train(tiny_models.saved_once("llama", root), rows, str(output_dir), stage, world,
                                resume_from)

    return run


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--stages", default="2,3")
    parser.add_argument("--uninterrupted", action="store_true", help="train from the start and save")
    parser.add_argument("--resume-from",
                        type=int,
                        action="append",
                        default=[],
                        help="resume the checkpoints written on this many processes")
    args, _ = parser.parse_known_args()
    named = {}
    for stage in (int(s) for s in args.stages.split(",")):
        if args.uninterrupted:
            named[f"uninterrupted/zero{stage}"] = case(args.root, stage)
        for writer in args.resume_from:
            named[f"resume-from{writer}/zero{stage}"] = case(args.root, stage, writer)
    run_cases(named)
