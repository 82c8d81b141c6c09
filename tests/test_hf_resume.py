# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The Hugging Face Trainer resumes a DeepSpeed checkpoint on another number of processes and continues the run that
never stopped.

A tiny Llama trains 4 steps of 8 padded rows with the Trainer (AdamW, warm-up then linear decay, clipping 1.0, fp32,
CPU) on 2 processes (micro-batch 2, GAS 2), saving checkpoint-2 and checkpoint-4. A second launch on 1 process (GAS 4:
the same 8 rows a step) calls ``trainer.train(resume_from_checkpoint=".../checkpoint-2")`` with ``"checkpoint":
{"reshard_on_load": true}`` in its DeepSpeed config (patch Reshard-a-ZeRO-checkpoint-on-load-for-another-data-p) and
trains steps 3 and 4. It must start at step 2 and end at step 4 with the learning rate and weights of the 2-process run
(weights within 1e-6: another split sums in another order). On 0.19.8 the Trainer's ``engine.load_checkpoint`` raises
``ZeRORuntimeException``; converted by hand, ZeRO-3 gave every param group the first one's settings (the Trainer's
biases and norms, kept out of weight decay, decayed: 1e-3 off; patch
Give-each-ZeRO-3-param-group-and-sub-group-its-own-s).
"""

from pathlib import Path

import pytest
import torch

from helpers.client_resume import assert_resumed_where_saved, written_and_resumed
from helpers.continuation import relative_error
from helpers.hf_required import require_transformers_and_accelerate

require_transformers_and_accelerate()

from hf_training.resume_run import SAVE_STEPS, STEPS  # noqa: E402

WORKER = Path(__file__).parent / "workers" / "hf_resume.py"
FP32_REORDERED = 1e-6


@pytest.fixture(scope="module")
def runs(tmp_path_factory, extensions_dir, request):
    """The 2-process run from the start, and the 1-process run resumed from its checkpoint-2, per ZeRO stage."""
    return written_and_resumed(WORKER, tmp_path_factory.mktemp("hf-resume"), extensions_dir, request)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3], ids=["zero2", "zero3"])
def test_trainer_resumes_on_fewer_processes(runs, stage):
    written, (resumed, ) = runs(stage)
    uninterrupted = assert_resumed_where_saved(written, resumed, STEPS, SAVE_STEPS, "the Trainer")
    error = relative_error(torch.tensor(uninterrupted["weights"], dtype=torch.float64),
                           torch.tensor(resumed["weights"], dtype=torch.float64))
    # The resumed Trainer's log history starts with the checkpoint's (steps 1-2).
    losses = (uninterrupted["losses"][SAVE_STEPS:], resumed["losses"][SAVE_STEPS:])
    print(f"ZeRO-{stage}: 2 -> 1 process(es): weights at step {STEPS} {error:.3g} from the uninterrupted run's; "
          f"losses of steps {SAVE_STEPS + 1}-{STEPS} {losses[0]} (uninterrupted) {losses[1]} (resumed)")
    assert error <= FP32_REORDERED, (f"ZeRO-{stage}: resumed on 1 process, the weights at step {STEPS} are "
                                     f"{error:.3g} (relative) from the uninterrupted 2-process run's")
