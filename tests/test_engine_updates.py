# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""One optimizer step on several engine paths equals a plain fp64 PyTorch step, at two GAS splits.

Regression tests for three bugs of deepspeed 0.19.8 (all fail on it, see tools/test-against-upstream):
- pipeline + fp32 + gradient clipping: later stages dropped out of the clip norm (update x1.42);
  patch "Count every pipeline stage in clip_grad_norm_";
- fp16 with ZeRO stage 0: the loss was never scaled, so step() divided the update by the loss scale;
  patch "Scale the loss for the fp16 optimizers of ZeRO stage 0";
- a trainer that scales the loss itself and sets ``engine.scale_wrt_gas = False`` (fairseq): the
  attribute was ignored since 0.18.3, so the update was 1/GAS of the right one; patch "Honour the
  engine's scale_wrt_gas attribute again";
- ZeRO-3 without reduce-scatter and gradient_predivide_factor equal to the world size: the gradient was
  divided by the factor twice (update x0.5 on 2 ranks); patch "Undo ZeRO-3's gradient pre-division when
  the factor equals the world size". The other prescaling cases establish paths 0.19.8 already had right.
"""

import pytest

from toolkit.launch import launch_cases
from helpers.repo import REPO

WORKER = REPO / "tests" / "workers" / "engine_updates.py"
# fp32: accumulation order only (~1e-6 seen); fp16: weights keep 11 bits (1.2e-2 seen).
TOLERANCE = {
    "zero0_fp16_static_scale": 2e-2,
    "zero0_fp16_dynamic_scale": 2e-2,
    "zero1_fp16_dynamic_scale": 2e-2,
    "trainer_scaled_zero0_fp32": 1e-4,
    "trainer_scaled_zero2_fp32": 1e-4,
    "trainer_scaled_zero2_fp32_tensor_backward": 1e-4,
    **{
        f"{how}_{path}_fp32": 1e-4
        for how in ("prescale", "predivide")
        for path in ("zero0", "zero1", "zero2_allreduce", "zero3_allreduce")
    },
    # deepspeed.checkpointing's recomputation (the layers after the first): reentrant at ZeRO 0-3, non-reentrant at
    # ZeRO 0-2 (under ZeRO-3 it raises in backward: upstream issue #4595).
    **{
        f"checkpointed_zero{stage}_fp32": 1e-4
        for stage in range(4)
    },
    **{
        f"non_reentrant_checkpointed_zero{stage}_fp32": 1e-4
        for stage in range(3)
    },
    "pipe2_fp32_clip_off": 1e-4,
    "pipe2_fp32_clip_on": 1e-4,
}


@pytest.fixture(scope="module")
def launched(extensions_dir):
    return launch_cases(WORKER, nprocs=2, extensions_dir=extensions_dir, timeout=900)


@pytest.mark.parametrize("case", sorted(TOLERANCE))
def test_update_matches_fp64_reference(launched, case):
    tolerance = TOLERANCE[case]
    for rank, splits in enumerate(launched.case(case)):
        for split, result in splits.items():
            where = f"rank {rank}, micro-batch x GAS = {split}"
            assert abs(result["factor"] -
                       1) <= tolerance, f"{where}: update is x{result['factor']:.4f} the reference's"
            assert result["max_rel_error"] <= tolerance, f"{where}: relative error {result['max_rel_error']:.2e}"


def test_unscaled_backward_is_refused(launched):
    """fp16 ZeRO-0 cannot take a loss.backward() the engine did not scale: it must say so, not train."""
    assert all(message for message in launched.case("zero0_fp16_unscaled_backward"))


def test_scale_wrt_gas_must_be_a_bool(launched):
    """engine.scale_wrt_gas = "no" must raise, naming the attribute, not train as if it were true."""
    for message in launched.case("scale_wrt_gas_type_error"):
        assert message and "engine.scale_wrt_gas" in message
