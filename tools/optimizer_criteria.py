# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""When a case of ``tests/workers/optimizer_updates.py`` passes: its weights' change after three clipped steps
against the fp64 PyTorch reference, and its reported global grad norm against the gradient's, within what the
case's dtype allows. Shared by the tests and by ``tools/optimizer-table``."""

# Worst relative error of the weights' total change, by dtype. fp32: 5.7e-6 seen (Muon, Newton-Schulz in fp32),
# 1.6e-5 (Lion). bf16 and fp16 forward and backward passes move Muon's update most: Newton-Schulz lifts every
# singular value to about 1, so rounding in the gradient's small directions shows at full size (bf16 6e-2 to
# 1.3e-1 with clipping off or on; fp16 1e-2 to 1.9e-2). 0.19.8's clipped Muon update is 5.8e-1 off.
UPDATE_TOLERANCE = {"fp32": 1e-4, "bf16": 1.5e-1, "fp16": 5e-2}
# Muon's update carries the rounding of the dtype its Newton-Schulz runs in (DeepSpeed's Gram Newton-Schulz: fp16
# where the accelerator has it, as GPUs do, else fp32): fp16 moved the fp32 cases' update by 6.5e-3.
NEWTON_SCHULZ_TOLERANCE = {"float32": 0.0, "float16": 2e-2}
# Relative error of the reported norm against the fp64 gradient's: fp32 3e-7 seen, bf16 6e-4, fp16 4e-4.
NORM_TOLERANCE = {"fp32": 1e-5, "bf16": 1e-2, "fp16": 2e-3}
# From the second step on, the gradient is taken at weights that carry the first update's Newton-Schulz rounding:
# fp16 there (a CPU with AVX512-FP16 counts as fp16-capable, as GPUs do) moved an fp32 case's later norms by up to
# 4.6e-5. The first step's norm comes before any update and keeps the dtype's tolerance (0.19.8 reported the
# update's norm, 4.6x the gradient's, from the first step on).
NEWTON_SCHULZ_NORM_TOLERANCE = {"float32": 0.0, "float16": 5e-4}


def dtype_of(case):
    return next(dtype for dtype in UPDATE_TOLERANCE if f"_{dtype}" in case)


def problems(case, splits):
    """What is wrong with one rank's result of ``case`` ({split: value}); empty when it passes."""
    dtype = dtype_of(case)
    found = []
    for split, result in splits.items():
        allowed = max(UPDATE_TOLERANCE[dtype], NEWTON_SCHULZ_TOLERANCE.get(result.get("newton_schulz_dtype"), 0.0))
        if result["max_rel_error"] > allowed:
            found.append(f"{split}: update error {result['max_rel_error']:.2e} > {allowed:.0e}")
        for step, (norm, expected) in enumerate(zip(result["norms"], result["reference_norms"])):
            tolerance = NORM_TOLERANCE[dtype]
            if step > 0:
                tolerance = max(tolerance, NEWTON_SCHULZ_NORM_TOLERANCE.get(result.get("newton_schulz_dtype"), 0.0))
            # ZeRO-0 fp32 takes no norm without clipping (the engine reports none): nothing to compare.
            if norm is not None and abs(norm - expected) > tolerance * expected:
                found.append(f"{split}: step {step + 1} norm {norm:.4f}, the gradient's {expected:.4f}")
    return found


def collectives(splits):
    """The most reducing collectives any boundary step() of the case took."""
    return max(max(result["collectives_in_boundary_step"]) for result in splits.values())
