# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""How far one run's updates are from another's: sums over this rank's elements, then summed over every rank.

Every element of the model is owned by one rank (ownership.py), so sums over owned elements, added up over the
ranks, are sums over the model. A check gathers each split's sums in one collective (``gather``).
"""

import math

from .ownership import sum_over_ranks


def update_sums(final, start, expected_final, expected_start):
    """<obs, exp>, <exp, exp>, |obs - exp|^2, <obs, obs> of the update (final - start) against the expected one,
    over this rank's tensors."""
    dot = exp_sq = diff_sq = obs_sq = 0.0
    for name, value in final.items():
        observed = (value - start[name]).double()
        wanted = (expected_final[name] - expected_start[name]).double()
        dot += (observed * wanted).sum().item()
        exp_sq += (wanted * wanted).sum().item()
        diff_sq += ((observed - wanted)**2).sum().item()
        obs_sq += (observed * observed).sum().item()
    return dot, exp_sq, diff_sq, obs_sq


def sums_between(weights, expected, steps):
    """This rank's update_sums of ``steps`` steps of two runs' kept weights (index 0: before the first step)."""
    return [update_sums(weights[step], weights[0], expected[step], expected[0]) for step in range(1, steps + 1)]


def sums_as_trained(stream, expected):
    """This rank's update_sums of each step of a run as it trains (``stream``: its weights before the first step,
    then after each), against ``expected``'s kept weights, or against itself when ``expected`` is None. Only the
    expected run's weights are kept."""
    start = next(stream)
    if expected is not None and same_on_every_rank(start, expected[0]):
        start = expected[0]  # the same seed and config start from the same weights: one copy of them
    sums = []
    for step, current in enumerate(stream, 1):
        sums.append(
            update_sums(current, start, current, start) if expected is
            None else update_sums(current, start, expected[step], expected[0]))
        del current
    return sums


def same_on_every_rank(ours, theirs):
    """Whether two runs' owned weights are identical on every rank (one collective)."""
    same = ours.keys() == theirs.keys() and all(ours[name].equal(theirs[name]) for name in ours)
    return sum_over_ranks([0.0 if same else 1.0])[0] == 0.0


def gather(**local):
    """``{name: list of floats}`` summed over every rank, in one collective."""
    names = list(local)
    totals = sum_over_ranks([value for name in names for value in local[name]])
    gathered, at = {}, 0
    for name in names:
        gathered[name] = totals[at:at + len(local[name])]
        at += len(local[name])
    return gathered


def flat(step_sums):
    return [value for sums in step_sums for value in sums]


def relative_errors(totals):
    """Per step: ||update - expected update|| / ||expected update||, from gathered update_sums (flattened; where
    nothing was to move, any move is infinitely wrong: a zero expected update must not pass a moved one)."""
    return [
        math.sqrt(totals[s + 2] / totals[s + 1]) if totals[s + 1] else (math.inf if totals[s + 2] else 0.0)
        for s in range(0, len(totals), 4)
    ]
