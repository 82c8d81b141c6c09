# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Name the likely mistake behind a wrong update or norm from the factor between observed and expected."""

MATCH = 0.03  # a factor within 3% of a candidate is taken as that candidate


def candidate_factors(gas, world, loss_scale=None):
    """(factor, explanation) for the mistakes gradient accumulation is known to make."""
    found = [
        (gas, f"gradients look summed over micro-batches, not averaged: = GAS ({gas})"),
        (1 / gas, f"gradients look divided by GAS twice, or only one micro-batch of {gas} kept: = 1/GAS"),
        (world, f"gradients look summed over data-parallel ranks, not averaged: = world size ({world})"),
        (1 / world, f"gradients look divided by the world size twice, or only one rank's kept: = 1/{world}"),
        ((gas - 1) / gas, f"one micro-batch of {gas} looks dropped from the average: = (GAS-1)/GAS"),
    ]
    # Only where they differ from the readings above (GAS=1, one rank, GAS=2).
    if gas > 1 and world > 1:
        found += [
            (gas * world, f"gradients look summed over micro-batches and ranks: = GAS x world size ({gas * world})"),
            (1 / (gas * world), "gradients look divided by GAS x world size once too often: = 1/(GAS x world)"),
        ]
    if gas > 2:
        found.append((gas / (gas - 1), "one micro-batch looks counted twice: = GAS/(GAS-1)"))
    if loss_scale and loss_scale != 1:
        found += [
            (1 / loss_scale,
             f"the loss looks never scaled, yet the gradients were divided by the loss scale: = 1/loss_scale ({loss_scale:g})"
             ),
            (loss_scale, f"the gradients look never unscaled: = loss_scale ({loss_scale:g})"),
        ]
    # A factor of 1 explains nothing (GAS=1 or one rank).
    return [(f, text) for f, text in found if f > 0 and abs(f - 1) > MATCH]


def explain_factor(factor, gas, world, loss_scale=None):
    """A one-line reading of ``factor`` (observed / expected), or None when it is 1."""
    if factor != factor:  # nan
        return "no usable factor (nan)"
    if abs(factor - 1) <= MATCH / 3:
        return None
    # Several readings can share a factor (GAS = world size = 2): name them all.
    readings = [
        text for candidate, text in candidate_factors(gas, world, loss_scale) if abs(factor / candidate - 1) <= MATCH
    ]
    if readings:
        return f"x{factor:.4g}: " + "; or ".join(readings)
    return f"x{factor:.4g}: no clean factor (not GAS, world size, loss scale or their inverses)"
