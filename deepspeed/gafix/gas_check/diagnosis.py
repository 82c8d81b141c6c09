# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Name the mistake behind a failed check only when it explains every split, else say so.

A known cause is a factor that depends on the split: gradients summed over micro-batches give an
update of GAS times the right one, so 1x at GAS 1, 2x at GAS 2, 8x at GAS 8. One split's factor
alone proves nothing (x0.7349 at GAS 4 is near (GAS-1)/GAS = 0.75 by chance), so a cause is named
only when, on every split of the check (passing ones included: x GAS must leave GAS 1 alone):

- the observed factor (least squares, observed update vs expected) is the cause's factor within
  ``MATCH``, and
- what is left after dividing the update by the cause's factor is within the check's tolerance
  (the error is that factor and nothing more).

Otherwise the reading is "no known cause", with the factor and residual of every split.
"""

import math
from dataclasses import dataclass
from typing import Callable

MATCH = 0.03  # an observed factor within 3% of a cause's factor is taken as that factor


@dataclass(frozen=True)
class Cause:
    mistake: str  # what the code did wrong
    formula: str  # the factor in words, "{gas}", "{world}", "{scale}", "{sp}" filled in per split
    factor: Callable  # (gas, world, loss_scale, sequence parallel) -> the factor it puts on the update


def _only_accumulating(factor):
    # A micro-batch dropped or counted twice needs accumulation: at GAS 1 nothing is wrong.
    return lambda gas, world, scale, sp: factor(gas) if gas > 1 else 1.0


CAUSES = (
    # Sequence parallelism: each rank backpropagates either its share of the samples' loss (the SP ranks' gradients
    # must add up) or the loss gathered over them (they must be averaged); listed first, as the likelier reading
    # where the world is one SP group.
    Cause("the sequence-parallel ranks' gradients averaged where each rank's loss is its share (they must add up)",
          "1/sequence parallel (1/{sp})", lambda gas, world, scale, sp: 1 / sp),
    Cause(
        "the sequence-parallel ranks' gradients added where each rank's loss is the gathered one (they must be "
        "averaged)", "sequence parallel ({sp})", lambda gas, world, scale, sp: sp),
    Cause("gradients summed over micro-batches, not averaged", "GAS ({gas})", lambda gas, world, scale, sp: gas),
    Cause("gradients divided by GAS twice, or only one micro-batch of GAS kept", "1/GAS (1/{gas})",
          lambda gas, world, scale, sp: 1 / gas),
    Cause("gradients summed over data-parallel ranks, not averaged", "world size ({world})",
          lambda gas, world, scale, sp: world),
    Cause("gradients divided by the world size twice, or only one rank's kept", "1/world size (1/{world})",
          lambda gas, world, scale, sp: 1 / world),
    Cause("gradients summed over micro-batches and ranks", "GAS x world size ({gas} x {world})",
          lambda gas, world, scale, sp: gas * world),
    Cause("gradients divided by GAS x world size once too often", "1/(GAS x world size)",
          lambda gas, world, scale, sp: 1 / gas / world),
    Cause("one micro-batch dropped from the average", "(GAS-1)/GAS", _only_accumulating(lambda gas: (gas - 1) / gas)),
    Cause("one micro-batch counted twice", "(GAS+1)/GAS", _only_accumulating(lambda gas: (gas + 1) / gas)),
    Cause("the gradients never unscaled", "loss scale ({scale:g})", lambda gas, world, scale, sp: scale),
    Cause("the loss never scaled, yet the gradients divided by the loss scale", "1/loss scale (1/{scale:g})",
          lambda gas, world, scale, sp: 1 / scale),
)


@dataclass(frozen=True)
class Observation:
    """One split's step-1 update against the expected one, as sums over every parameter."""
    gas: int
    world: int
    dot: float  # <observed, expected>
    expected_sq: float  # <expected, expected>
    observed_sq: float  # <observed, observed>
    sp: int = 1  # ranks per sequence-parallel group

    @property
    def factor(self):
        return self.dot / self.expected_sq if self.expected_sq else float("nan")

    def residual(self, factor):
        """||observed / factor - expected|| / ||expected||."""
        if not self.expected_sq or not factor:
            return float("nan")
        left = self.observed_sq / factor**2 - 2 * self.dot / factor + self.expected_sq
        return math.sqrt(max(left, 0.0) / self.expected_sq)


def cause_fits(cause, observations, tolerance, loss_scale):
    """True when ``cause`` explains the factor and leaves a residual within ``tolerance`` on every split."""
    if loss_scale is None and "{scale" in cause.formula:
        return False
    predicted = [cause.factor(o.gas, o.world, loss_scale or 1.0, o.sp) for o in observations]
    if all(abs(p - 1) <= MATCH for p in predicted):
        return False  # a factor of 1 on every split explains nothing
    return all(abs(o.factor / p - 1) <= MATCH and o.residual(p) <= tolerance for o, p in zip(observations, predicted))


def explain(observations, tolerance, loss_scale=None):
    """The causes that explain every split (usually one; several when the splits cannot tell them apart)."""
    if not observations or any(math.isnan(o.factor) for o in observations):
        return []
    return [cause for cause in CAUSES if cause_fits(cause, observations, tolerance, loss_scale)]


def describe(cause, observation, loss_scale=None):
    formula = cause.formula.format(gas=observation.gas,
                                   world=observation.world,
                                   scale=loss_scale or 1.0,
                                   sp=observation.sp)
    return f"{cause.mistake}: update x{observation.factor:.4g} = {formula}, as on every split"


def no_known_cause(observations):
    numbers = ", ".join(f"GAS {o.gas}: x{o.factor:.4g} (residual {o.residual(o.factor):.1e})" for o in observations)
    return f"no known cause: the step-1 update factors do not fit one mistake on every split ({numbers})"


def diagnose(results, loss_scale, clip, sp=1):
    """Per split, the lines of its diagnosis (none for a split that passed or is unresolved): a cause only when it
    explains every split. ``sp``: ranks per sequence-parallel group."""
    diagnoses = [[] for _ in results]
    if all(r.passed for r in results):
        return diagnoses
    tol = max(r.tolerance for r in results)
    updates = [Observation(r.gas, r.world, *r.update_sums, sp=sp) for r in results]
    update_causes = explain(updates, tol, loss_scale)
    norms_reported = not any(math.isnan(r.norm_factor) for r in results)
    norms = [Observation(r.gas, r.world, r.norm_factor, 1.0, r.norm_factor**2, sp=sp) for r in results]
    norm_causes = explain(norms, tol, loss_scale) if norms_reported else []
    update_wrong = not all(r.updates_ok for r in results)
    norm_wrong = norms_reported and any(r.norm_error > r.tolerance for r in results)
    norm_wrong_at_step_1 = norms_reported and any(abs(r.norm_factor - 1) > r.tolerance for r in results)
    for result, update, norm, lines in zip(results, updates, norms, diagnoses):
        if result.passed or result.unresolved:
            continue
        if update_wrong:
            lines += [describe(cause, update, loss_scale) for cause in update_causes] or [no_known_cause(updates)]
        if norm_wrong and not norm_wrong_at_step_1:
            lines.append("reported grad norm: right at step 1; it differs later because the weights do"
                         if update_wrong else "reported grad norm: right at step 1, wrong after it")
        elif norm_wrong:
            factors = ", ".join(f"GAS {r.gas}: x{r.norm_factor:.4g}" for r in results)
            lines += [
                "reported grad norm: " + describe(cause, norm, loss_scale).replace("update x", "norm x")
                for cause in norm_causes
            ] or [f"reported grad norm: no known cause ({factors})"]
        spread = [f for f in result.rank_factors if not math.isnan(f)]
        if spread and max(spread) - min(spread) > 0.03 * max(abs(f) for f in spread):
            lines.append("update factor differs between ranks (per pipeline stage?): " +
                         ", ".join(f"rank {r} x{f:.4g}" for r, f in enumerate(result.rank_factors)))
        if clip > 0 and update_wrong and not update_causes:
            lines.append(clipping_reading(clip, [r.update_factor for r in results]))
    return diagnoses


def clipping_reading(clip, factors):
    """What an unexplained update factor says when gradient clipping is active."""
    text = f"gradient clipping is active ({clip:g}): it hides a scaled gradient's factor (check with gradient_clipping 0)"
    if all(f > 1 + MATCH for f in factors):
        return text + ("; updates larger than expected on every split mean a clip coefficient too large: the norm "
                       "it used may be smaller than the gradient's (a norm that misses part of the model: a pipeline "
                       "stage, experts, a rank's partition)")
    if all(f < 1 - MATCH for f in factors):
        return text + ("; updates smaller than expected on every split mean a clip coefficient too small: the norm "
                       "it used may be larger than the gradient's")
    return text
