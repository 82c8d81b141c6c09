# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""ds_gas_check's diagnosis names a cause only when it explains every split (no launch: injected errors).

Each case builds, per split, the update a buggy engine would produce from per-micro-batch gradients
(distinct per micro-batch, as the checker's data makes them), and feeds the sums the checker measures
to ``diagnosis.explain``.
"""

import dataclasses

import pytest
import torch

from deepspeed.gafix.gas_check.diagnosis import Observation, explain, no_known_cause

pytestmark = pytest.mark.fork_only

WORLD = 2
SPLITS = (1, 2, 4, 8)  # GAS of the default splits 16x1, 8x2, 4x4, 2x8
TOLERANCE = 1e-5  # fp32


def micro_gradients(gas, spread, seed=0):
    """GAS x WORLD micro-batch gradients: a common direction plus ``spread`` times a per-micro-batch part."""
    gen = torch.Generator().manual_seed(seed)
    common = torch.randn(500, generator=gen, dtype=torch.float64)
    return [common + spread * torch.randn(500, generator=gen, dtype=torch.float64) for _ in range(gas * WORLD)]


def observe(gas, engine, spread):
    grads = micro_gradients(gas, spread, seed=gas)
    expected = sum(grads) / len(grads)
    observed = engine(grads, gas)
    return Observation(gas, WORLD, float(observed @ expected), float(expected @ expected), float(observed @ observed))


def correct(grads, gas):
    return sum(grads) / len(grads)


def times_gas(grads, gas):  # scale_wrt_gas=False: summed over micro-batches
    return sum(grads) / WORLD


def over_gas(grads, gas):  # divided by GAS twice
    return sum(grads) / len(grads) / gas


def times_world(grads, gas):  # summed over ranks
    return sum(grads) / gas


def drops_last_micro_batch(grads, gas):  # each rank's last micro-batch left out of the accumulation
    if gas == 1:
        return correct(grads, gas)
    kept = [g for i, g in enumerate(grads) if i % gas != gas - 1]
    return sum(kept) / len(grads)


def constant_0_7349(grads, gas):  # the H100 case: x0.7349 on every split, near (GAS-1)/GAS only at GAS 4
    return 0.7349 * correct(grads, gas)


def explained(engine, spread=0.5):
    observations = [observe(gas, engine, spread) for gas in SPLITS]
    return [cause.mistake for cause in explain(observations, TOLERANCE)], observations


@pytest.mark.parametrize("engine, mistake", [
    (times_gas, "gradients summed over micro-batches, not averaged"),
    (over_gas, "gradients divided by GAS twice, or only one micro-batch of GAS kept"),
    (times_world, "gradients summed over data-parallel ranks, not averaged"),
])
def test_a_factor_that_fits_every_split_is_named(engine, mistake):
    causes, _ = explained(engine)
    assert causes == [mistake]


def test_a_constant_factor_near_one_splits_cause_is_not_named():
    causes, observations = explained(constant_0_7349)
    assert causes == []
    assert abs(observations[2].factor - 0.75) < 0.03, "GAS 4 alone would have read as (GAS-1)/GAS"
    line = no_known_cause(observations)
    assert line.startswith("no known cause") and "GAS 4: x0.7349" in line and "GAS 1: x0.7349" in line


def test_a_dropped_micro_batch_is_named_only_when_the_factor_is_all_there_is():
    # Micro-batches with the same gradient: the update is exactly (GAS-1)/GAS of the right one.
    causes, _ = explained(drops_last_micro_batch, spread=0.0)
    assert causes == ["one micro-batch dropped from the average"]
    # Distinct micro-batch gradients: the factor is near (GAS-1)/GAS but the direction moved too.
    causes, observations = explained(drops_last_micro_batch, spread=0.5)
    assert causes == []
    assert all(o.residual(o.factor) > 1e-3 for o in observations[1:])


def test_a_correct_engine_explains_nothing():
    causes, observations = explained(correct)
    assert causes == [] and all(abs(o.factor - 1) < 1e-12 for o in observations)


def test_a_single_split_cannot_name_a_cause_its_factor_only_resembles():
    # GAS 2 with 2 ranks: x2 is GAS and world size alike; with only that split both fit (named together),
    # with the GAS 1 split beside it only the world size does.
    both = [observe(2, times_world, 0.5)]
    assert [c.mistake for c in explain(both, TOLERANCE)] == [
        "gradients summed over micro-batches, not averaged", "gradients summed over data-parallel ranks, not averaged"
    ]
    two = [observe(1, times_world, 0.5), observe(2, times_world, 0.5)]
    assert [c.mistake for c in explain(two, TOLERANCE)] == ["gradients summed over data-parallel ranks, not averaged"]


def test_sequence_parallel_factors_are_named_with_the_loss_recipe():
    """A sequence-parallel group's gradients averaged where they must add up (0.19.8's ZeRO-3 reduce-scatter on each
    rank's share of the loss) give x1/SP on every split; at SP 2 of 4 ranks it is told from the world size, and
    without sequence parallelism it is never named."""
    halved = [Observation(gas, 4, dot=0.5, expected_sq=1.0, observed_sq=0.25, sp=2) for gas in SPLITS]
    assert [c.formula for c in explain(halved, TOLERANCE)] == ["1/sequence parallel (1/{sp})"]
    doubled = [Observation(gas, 4, dot=2.0, expected_sq=1.0, observed_sq=4.0, sp=2) for gas in SPLITS]
    assert [c.formula for c in explain(doubled, TOLERANCE)] == ["sequence parallel ({sp})"]
    plain = [dataclasses.replace(o, sp=1) for o in halved]
    assert all("sequence" not in c.mistake for c in explain(plain, TOLERANCE))


def test_loss_scale_causes_need_a_loss_scale():
    observations = [Observation(gas, WORLD, dot=1 / 256, expected_sq=1.0, observed_sq=(1 / 256)**2) for gas in SPLITS]
    assert explain(observations, TOLERANCE) == []
    assert [c.formula for c in explain(observations, TOLERANCE, loss_scale=256)] == ["1/loss scale (1/{scale:g})"]


def split_result(gas, update_error, compared_with="fp64 reference", **fields):
    from deepspeed.gafix.gas_check.check import SplitResult
    return SplitResult(micro=16 // gas,
                       gas=gas,
                       world=WORLD,
                       norm_error=0.0,
                       update_errors=[update_error],
                       update_factor=1.0,
                       norm_factor=1.0,
                       tolerance=fields.pop("tolerance", TOLERANCE),
                       compared_with=compared_with,
                       **fields)


def test_the_table_says_what_the_splits_were_compared_with():
    from deepspeed.gafix.gas_check.check import format_results
    with_reference = format_results([split_result(1, 0.0), split_result(2, 1e-7)], "title")
    assert "compared with" not in with_reference
    without = format_results([split_result(1, 0.0, "itself"), split_result(2, 1e-7, "split 16 x 1 x 2")], "title")
    assert "compared with: split 16 x 1 x 2 (no fp64 reference" in without


def test_the_table_says_when_the_models_rounding_raised_the_tolerance():
    from deepspeed.gafix.gas_check.check import format_results
    raised = split_result(1, 1e-4, noise_floor=2e-5, tolerance_for_dtype=TOLERANCE, floor_factor=10, tolerance=2e-4)
    text = format_results([raised], "title")
    assert "tolerance: 2.0e-04, 10 x what rounding alone gives this model in plain PyTorch (up to 2.0e-05)" in text
    capped = split_result(1, 1e-2, noise_floor=2e-2, tolerance_for_dtype=2e-2, floor_factor=3, tolerance=5e-2)
    text = format_results([capped], "title")
    assert "3 x what rounding alone gives this model in plain PyTorch (up to 2.0e-02)" in text
    assert "the tolerance stays at 5e-02" in text


BF16 = {"bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}
FP32_ACCUMULATION = dict(BF16, data_types={"grad_accum_dtype": "fp32"})


def test_bf16_accumulation_is_recognised_from_the_config():
    from deepspeed.gafix.gas_check.accumulation import accumulates_in_bf16
    assert accumulates_in_bf16(BF16)
    assert accumulates_in_bf16(dict(BF16, data_types={"grad_accum_dtype": "bf16"}))
    assert not accumulates_in_bf16(FP32_ACCUMULATION)
    assert not accumulates_in_bf16({"fp16": {"enabled": True}})
    assert not accumulates_in_bf16({})


def bf16_splits(*errors):
    """Splits at GAS 1, 2, 4, 8, 16 with these step-1 update errors (bf16's tolerance, 2e-2)."""
    return [split_result(gas, error, tolerance=2e-2) for gas, error in zip((1, 2, 4, 8, 16), errors)]


def test_bf16_accumulation_is_named_when_only_accumulating_splits_fail():
    """Measured on the CPU (AdamW, ZeRO-2): 1.1e-5 at GAS 1 to 8, 6.4e-2 at GAS 16; with fp32 accumulation
    1.3e-5 at GAS 16."""
    from deepspeed.gafix.gas_check.accumulation import reading
    note, cause = reading(BF16, bf16_splits(1.1e-5, 1.1e-5, 1.2e-5, 1.1e-5, 6.4e-2))
    assert "GAS 1: 1.1e-05" in note and "GAS 16: 6.4e-02" in note and "growing with GAS;" in note
    assert cause is not None and '"data_types": {"grad_accum_dtype": "fp32"}' in cause
    # ZeRO-0 refuses bf16 weights with fp32 accumulation: the change names ZeRO too.
    _, cause = reading(dict(BF16, zero_optimization={"stage": 0}), bf16_splits(1e-5, 1e-5, 1e-5, 1e-5, 6e-2))
    assert "ZeRO stage 1 or more" in cause


def test_bf16_accumulation_is_not_blamed_where_it_cannot_be():
    from deepspeed.gafix.gas_check.accumulation import reading
    # GAS 1 fails too: accumulation is not what is wrong.
    note, cause = reading(BF16, bf16_splits(5e-2, 5e-2, 5e-2, 5e-2, 5e-2))
    assert note is not None and cause is None
    # The same error at every GAS (seen on an H100: Adam and bf16 rounding at GAS 1 already): the note does
    # not claim it grows.
    assert "not growing with GAS here" in note
    # Everything passes: the note only.
    note, cause = reading(BF16, bf16_splits(1e-5, 1e-5, 1e-5, 1e-5, 1e-5))
    assert note is not None and cause is None
    # fp32 accumulation, or no accumulation at all: nothing to say.
    assert reading(FP32_ACCUMULATION, bf16_splits(1e-5, 1e-5, 1e-5, 1e-5, 6e-2)) == (None, None)
    assert reading(BF16, bf16_splits(1e-5)) == (None, None)


def test_bf16_accumulation_is_not_blamed_for_an_error_of_order_one():
    """The 58M Llama without a reference, on padded token batches: a correct bf16 engine failed at GAS 2 with
    update error 2e-1 (the splits' losses differ by design) and was told "likely cause: bf16 gradient
    accumulation". Rounding once per micro-batch moves an update by a few percent at most: an O(1) error, or one
    that does not grow with GAS, is not put down to it."""
    from deepspeed.gafix.gas_check.accumulation import reading
    _, cause = reading(BF16, bf16_splits(1e-5, 2.1e-1))
    assert cause is None
    _, cause = reading(BF16, bf16_splits(1e-5, 5e-2, 5e-2, 5e-2, 5e-2))  # flat from GAS 2 on: grows 2x only once
    assert cause is not None
    _, cause = reading(BF16, bf16_splits(1e-5, 3e-2, 3e-2, 3e-2, 1.5e-1))  # over rounding's reach at GAS 16
    assert cause is None


def test_bf16_accumulation_note_leaves_out_a_split_compared_with_itself():
    """Without a reference the first split is compared with itself (error 0 by construction): it says nothing about
    growth with GAS."""
    from deepspeed.gafix.gas_check.accumulation import reading
    results = bf16_splits(0.0, 2.4e-3)
    results[0] = dataclasses.replace(results[0], compared_with="itself")
    note, cause = reading(BF16, results)
    assert "GAS 1" not in note and "GAS 2: 2.4e-03" in note and "growing" not in note
    assert cause is None
