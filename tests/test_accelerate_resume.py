# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""accelerate's ``load_state`` resumes a DeepSpeed run on another number of processes and continues the run that
never stopped.

A tiny Llama trains 4 steps of 8 rows in accelerate's own loop (``prepare``, ``accumulate``, ``backward``; AdamW and
a warm-up/decay schedule from the DeepSpeed config, clipping 1.0, fp32, CPU) on 2 processes (micro-batch 2, GAS 2)
and calls ``accelerator.save_state`` after step 2. A second launch on 1 process (GAS 4: the same 8 rows a step)
calls ``accelerator.load_state`` on it with ``"checkpoint": {"reshard_on_load": true}`` in its DeepSpeed config, skips
the micro-batches already trained and trains steps 3 and 4. It must start at step 2 and end at step 4 with the
learning rate of the 2-process run and its update within 1e-6 (another split sums in another order). On 0.19.8
accelerate's ``load_state`` (``engine.load_checkpoint``) raises ``ZeRORuntimeException``.
"""

from pathlib import Path

import pytest
import torch

from helpers.client_resume import assert_resumed_where_saved, written_and_resumed
from helpers.hf_required import require_transformers_and_accelerate

require_transformers_and_accelerate()

WORKER = Path(__file__).parent / "workers" / "accelerate_resume.py"
STEPS, SAVE_STEPS = 4, 2
FP32_REORDERED = 1e-6


@pytest.fixture(scope="module")
def runs(tmp_path_factory, extensions_dir, request):
    """The 2-process run from the start, and the 1-process run resumed from its state, per ZeRO stage."""
    return written_and_resumed(WORKER, tmp_path_factory.mktemp("accelerate-resume"), extensions_dir, request)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3], ids=["zero2", "zero3"])
def test_load_state_resumes_on_fewer_processes(runs, stage):
    written, (resumed, ) = runs(stage)
    uninterrupted = assert_resumed_where_saved(written, resumed, STEPS, SAVE_STEPS, "load_state")
    initial, final, ours = (torch.tensor(weights, dtype=torch.float64)
                            for weights in (uninterrupted["initial"], uninterrupted["weights"], resumed["weights"]))
    error = float((ours - final).norm() / (final - initial).norm())
    print(f"ZeRO-{stage}: 2 -> 1 process(es) through accelerate's load_state: the update to step {STEPS} "
          f"{error:.3g} from the uninterrupted run's")
    assert error <= FP32_REORDERED, (f"ZeRO-{stage}: resumed on 1 process, the update to step {STEPS} is {error:.3g} "
                                     "(relative) from the uninterrupted 2-process run's")
