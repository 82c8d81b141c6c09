# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""ALST / Ulysses sequence parallelism through accelerate: the grad norm and the update of one step against fp64
on the whole sequence.

tests/workers/accelerate_alst.py is accelerate's own ALST recipe (its test script test_ds_alst_ulysses_sp.py:
``ParallelismConfig(sp_backend="deepspeed")``, the loss gathered over the SP ranks) on 2 CPU ranks (SP 2),
started as accelerate's test starts it, ``accelerate launch --use_deepspeed --zero_stage=N``. On 0.19.8 ZeRO-2
sums the SP ranks' gradients of that gathered loss: twice the norm and, with clipping above it, twice the
update; ZeRO-3 averages them and is right. bf16 (what accelerate's script runs) is judged by its norm: its
forward and backward in bf16 put the update of this 2-layer model 7% from fp64 on any engine.
"""

import importlib.util

import pytest

from toolkit.launch import accelerate_command, launch_cases
from helpers.rank_results import assert_norm_matches, assert_update_matches
from helpers.repo import REPO

WORKER = REPO / "tests" / "workers" / "accelerate_alst.py"
CASES = [(stage, "no", gas) for stage in (2, 3) for gas in (1, 2)] + [(stage, "bf16", 2) for stage in (2, 3)]
FAST = {(2, "no", 2), (3, "no", 2)}


def case_id(case):
    stage, precision, gas = case
    return f"zero{stage}-{'fp32' if precision == 'no' else precision}-gas{gas}"


@pytest.mark.parametrize("case",
                         [case if case in FAST else pytest.param(case, marks=pytest.mark.slow) for case in CASES],
                         ids=case_id)
def test_alst_norm_and_update_match_fp64(case, extensions_dir):
    missing = [name for name in ("accelerate", "transformers") if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    stage, precision, gas = case
    launcher = accelerate_command("--use_deepspeed", f"--zero_stage={stage}", f"--mixed_precision={precision}",
                                  f"--gradient_accumulation_steps={gas}", "--gradient_clipping=1000")
    results = launch_cases(WORKER, 2, extensions_dir=extensions_dir, launcher=launcher).case("alst_step")
    assert all(result["global_steps"] == 1 and result["gas"] == gas for result in results), results
    if precision == "no":
        assert_norm_matches(results, 1e-6)
        assert_update_matches(results, 1e-5)
    else:
        assert_norm_matches(results, 1e-2)
