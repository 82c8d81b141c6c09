# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""fp16's dynamic loss scale settings on every ZeRO stage (``hysteresis``, ``consecutive_hysteresis``,
``min_loss_scale``), at every micro-batch x GAS split.

tests/workers/loss_scale_settings.py trains 8 steps on 2 ranks, one micro-batch of rank 1 turning inf in steps 1,
2 and 4, at 8x1 and 2x4 per rank. Each step that overflows is skipped (counted in ``engine.skipped_steps``) and
leaves no trace: the weights equal a run of the 5 clean steps alone (within fp16's rounding: the scales differ).
The scale after each step follows DeepSpeed's rule, written out in ``expected_scales``: under ZeRO an overflow halves
it only once ``hysteresis`` overflows have come (the count refills when the scale grows, or after every clean step
with ``consecutive_hysteresis``), never below ``min_loss_scale``; the clean step after ``loss_scale_window`` clean
ones doubles it. Without ZeRO, FP16_Optimizer and FP16_UnfusedOptimizer halve it at every overflow whatever the
hysteresis: upstream's own tests (half_precision/test_dynamic_loss_scale.py) pin that, so the fork keeps it.
"""

import pytest

from toolkit.launch import launch_cases
from helpers.repo import REPO

WORKER = REPO / "tests" / "workers" / "loss_scale_settings.py"
STAGES = range(4)
SETTINGS = ("hysteresis", "consecutive_hysteresis")
STEPS, POISONED = 8, (1, 2, 4)
INITIAL, WINDOW, HYSTERESIS, MIN_SCALE = 256.0, 2, 2, 100.0


def expected_scales(consecutive, hysteresis=HYSTERESIS):
    """The loss scale after each step, by the rule of DeepSpeed's loss scaler, written out here (not read from the
    engine): a clean step doubles the scale when the clean steps before it since the last overflow are a positive
    multiple of the window."""
    scale, hysteresis_left, clean_before, scales = INITIAL, hysteresis, 0, []
    for step in range(STEPS):
        if step in POISONED:
            clean_before = 0
            if hysteresis_left <= 1:
                scale = max(scale / 2, MIN_SCALE)
            else:
                hysteresis_left -= 1
        else:
            if consecutive:
                hysteresis_left = hysteresis
            if clean_before > 0 and clean_before % WINDOW == 0:
                hysteresis_left = hysteresis
                scale *= 2
            clean_before += 1
        scales.append(scale)
    return scales


EXPECTED = {"hysteresis": expected_scales(False), "consecutive_hysteresis": expected_scales(True)}
# Without ZeRO: no hysteresis, whichever the settings.
EXPECTED_WITHOUT_ZERO = expected_scales(False, hysteresis=1)


@pytest.fixture(scope="module")
def launched(extensions_dir):
    return launch_cases(WORKER, nprocs=2, extensions_dir=extensions_dir, timeout=1200)


def test_expected_scales_tell_the_settings_apart():
    """The rule's trajectories differ, each is held at or above the floor and grows again: the test can fail."""
    assert EXPECTED == {
        "hysteresis": [256, 256, 128, 128, 100, 100, 100, 200],
        "consecutive_hysteresis": [256, 256, 128, 128, 128, 128, 128, 256]
    }
    assert EXPECTED_WITHOUT_ZERO == [256, 128, 100, 100, 100, 100, 100, 200]


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("settings", SETTINGS)
def test_loss_scale_follows_its_settings(launched, stage, settings):
    for rank, splits in enumerate(launched.case(f"zero{stage}_{settings}")):
        for split, result in splits.items():
            expected = EXPECTED[settings] if stage else EXPECTED_WITHOUT_ZERO
            assert result["scales"] == expected, f"rank {rank}, {split}: {result['scales']}"


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("settings", SETTINGS)
def test_overflowing_steps_are_skipped_without_a_trace(launched, stage, settings):
    for rank, splits in enumerate(launched.case(f"zero{stage}_{settings}")):
        for split, result in splits.items():
            assert result["skipped"] == len(POISONED), f"rank {rank}, {split}"
            assert result["global_steps"] == STEPS, f"rank {rank}, {split}"
            for name, weights in result["weights"].items():
                clean = result["clean_weights"][name]
                error = max(abs(a - b) for a, b in zip(weights, clean)) / max(abs(b) for b in clean)
                assert error < 2e-3, f"rank {rank}, {split}, {name}: {error:.2e} from the clean steps' weights"


@pytest.mark.parametrize("stage", STAGES)
def test_an_overflow_at_the_floor_is_never_a_hang(launched, stage):
    """With the scale at min_loss_scale and no hysteresis left, an overflow: the ZeRO optimizers raise on every rank
    ("Current loss scale already at minimum"), the others skip the step and keep the floor (as 0.19.8 did)."""
    for rank, result in enumerate(launched.case(f"zero{stage}_floor")):
        if stage == 0:
            assert result["outcome"] == "stepped", f"rank {rank}: {result}"
            assert result["scales"] == [128.0, 128.0] and result["skipped"] == 2, f"rank {rank}: {result}"
        else:
            assert result["outcome"].startswith("Exception: Current loss scale already at minimum"), result
            assert result["scales"] == [128.0], f"rank {rank}: {result}"
