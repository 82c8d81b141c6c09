# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""What a split is allowed, and its verdict: PASS, UNRESOLVED or FAIL. Pure functions of gathered numbers."""

import math
from dataclasses import dataclass, field

from .comparison import relative_errors

# Relative errors allowed, by the dtype gradients are computed in. fp32: only the summation order
# differs from the reference (1e-7 seen). bf16 keeps 8 mantissa bits, fp16 11, and the gradients
# are rounded once per micro-batch before being accumulated (1e-2 seen up to GAS 8).
TOLERANCE = {"fp32": 1e-5, "bf16": 2e-2, "fp16": 2e-2}
MEASURED_UP_TO_GAS = 8
# Beyond those, a model can be ill-conditioned (attention biases whose gradient is pure rounding noise;
# Adam dividing by sqrt(v) + eps, which turns that noise into a full-size update): the check then
# also runs plain PyTorch in the engine's precision (fp32, or bf16/fp16 with fp32 master weights, on the
# engine's device) and allows FLOOR_FACTOR times the error that run has against the fp64 reference. In fp32 that error is
# noise amplified by the model, and two runs' noise differ (the engine's was 4x plain PyTorch's on a
# transformer with AdamW); in bf16/fp16 it is the rounding the engine does too (1.0-1.1x on a Llama).
FLOOR_FACTOR = {"fp32": 10, "bf16": 3, "fp16": 3}
# ... but never more than this: a dropped micro-batch at GAS 16 moves the update by 6%, so a looser
# check could not see it. A model whose rounding needs more is reported as such.
MAX_TOLERANCE = 5e-2


def tolerance(dtype, gas):
    """The relative error allowed for one split against the fp64 reference.

    Low-precision gradients are rounded once per micro-batch before they are added up, so the error
    grows with GAS like a random walk; the constants above were measured up to GAS 8.
    """
    base = TOLERANCE[dtype]
    if dtype == "fp32" or gas <= MEASURED_UP_TO_GAS:
        return base
    return base * math.sqrt(gas / MEASURED_UP_TO_GAS)


def raised_tolerance(tol, dtype, noise_floor):
    """The tolerance against the fp64 reference for a model whose rounding alone is ``noise_floor`` off it."""
    return max(tol, min(MAX_TOLERANCE, FLOOR_FACTOR[dtype] * noise_floor))


@dataclass(frozen=True)
class SplitResult:
    micro: int
    gas: int
    world: int
    norm_error: float  # max over steps of |reported - expected| / expected; nan when not reported
    update_errors: list  # per step: ||update - expected update|| / ||expected update||
    update_factor: float  # least-squares factor, step-1 update vs expected
    norm_factor: float  # step-1 reported norm / expected norm
    rank_factors: list = field(default_factory=list)  # update_factor on each rank's own parameters
    tolerance: float = 0.0
    diagnosis: list = field(default_factory=list)
    compared_with: str = "fp64 reference"
    update_sums: list = field(default_factory=list)  # step 1: <obs, exp>, <exp, exp>, <obs, obs>, all ranks
    losses: list = field(default_factory=list)  # per step: mean micro-batch loss over every rank
    norms: list = field(default_factory=list)  # per step: the engine's get_global_grad_norm()
    expected_losses: list = field(default_factory=list)
    expected_norms: list = field(default_factory=list)
    # ||update of this split's reference - update of the global-batch reference|| / ||...|| at step 1:
    # what averaging per-micro-batch means changes with this data (nan without a reference).
    loss_normalization_gap: float = float("nan")
    # The largest error (norm or update, any step) of plain PyTorch in the engine's precision against
    # the fp64 reference (nan without a reference).
    noise_floor: float = float("nan")
    tolerance_for_dtype: float = 0.0  # the tolerance from the dtype (and GAS) alone
    floor_factor: float = 0.0  # the tolerance allows this many times the noise floor
    # Per step: ||update - update of that plain PyTorch run|| / ||that update|| (empty without a reference).
    floor_update_errors: list = field(default_factory=list)
    small_buckets: str = ""  # what --small-buckets set ("" without it)
    skipped_steps: int = 0  # steps the engine skipped (non-finite gradients)
    # A split resumed from a checkpoint (ds_gas_check --restart): the step its first update_errors entry is, and
    # ||restored weights' update since the start - the reference's|| / ||the reference's|| at the step it resumed
    # at, with the same of plain PyTorch in the engine's precision (nan for a split that trained from the start).
    first_step: int = 1
    restored_error: float = float("nan")
    restored_floor_error: float = float("nan")

    @property
    def steps_matching_floor(self):
        """Steps off the fp64 reference by more than the tolerance, but within the dtype's tolerance of plain
        PyTorch in the engine's precision on the same micro-batches: that precision's rounding, which Adam
        turns into a full-size step where a gradient is near zero (an element's sign flips), not the engine's."""
        return [
            step
            for step, (error, floor) in enumerate(zip(self.update_errors, self.floor_update_errors), self.first_step)
            if error > self.tolerance and floor <= self.tolerance_for_dtype
        ]

    @property
    def updates_ok(self):
        matching = self.steps_matching_floor
        return self.restored_ok and all(e <= self.tolerance or step in matching
                                        for step, e in enumerate(self.update_errors, self.first_step))

    @property
    def restored_ok(self):
        """The weights a resumed split loaded are the reference's at that step, within what a split is allowed
        (or within the dtype's tolerance of plain PyTorch in the engine's precision, as steps_matching_floor)."""
        error, floor = self.restored_error, self.restored_floor_error
        return math.isnan(error) or error <= self.tolerance or floor <= self.tolerance_for_dtype

    @property
    def norm_ok(self):
        return math.isnan(self.norm_error) or self.norm_error <= self.tolerance

    @property
    def passed(self):
        return self.norm_ok and self.updates_ok

    @property
    def unresolved(self):
        """The norm agrees, and the update is off by more than MAX_TOLERANCE but by no more than this precision's
        rounding allows for this model (FLOOR_FACTOR x the noise floor): neither a pass nor a failure. Muon in
        bf16 does this: Newton-Schulz lifts the rounding in a gradient's small directions to full size."""
        allowed = self.floor_factor * self.noise_floor
        return (not self.passed and self.norm_ok and allowed > MAX_TOLERANCE
                and all(e <= allowed for e in self.update_errors)
                and (math.isnan(self.restored_error) or self.restored_error <= allowed))

    @property
    def verdict(self):
        return "PASS" if self.passed else "UNRESOLVED" if self.unresolved else "FAIL"

    @property
    def name(self):
        return f"{self.micro} x {self.gas} x {self.world}"


def measured(micro, gas, world, norms, expected_norms, sums, rank_factors, **fields):
    """A split's result from its reported norms and its gathered update sums against the expected run (flattened
    per step: <obs, exp>, <exp, exp>, |obs - exp|^2, <obs, obs>); ``fields``: the rest of SplitResult."""
    norm_errors = [abs(n - r) / r if r else abs(n - r) for n, r in zip(norms, expected_norms)]
    return SplitResult(micro=micro,
                       gas=gas,
                       world=world,
                       norm_error=max(norm_errors),
                       update_errors=relative_errors(sums),
                       update_factor=sums[0] / sums[1] if sums[1] else float("nan"),
                       norm_factor=norms[0] / expected_norms[0] if expected_norms[0] else float("nan"),
                       rank_factors=rank_factors,
                       update_sums=[sums[0], sums[1], sums[3]],
                       norms=norms,
                       expected_norms=expected_norms,
                       **fields)
