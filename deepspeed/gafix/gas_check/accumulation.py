# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""What accumulating gradients in bf16 costs a check, and the config change that removes it.

With bf16 and no ``data_types.grad_accum_dtype``, DeepSpeed accumulates the micro-batches' gradients
in bf16 (8 significant bits): every micro-batch's addition rounds the sum, so the error grows with
GAS. Measured with ``ds_gas_check`` (1 CPU rank, the built-in MLP, AdamW, ZeRO-2, splits 16x1 ...
1x16): step-1 update error 1.1e-5 at GAS 1 to 8, 6.4e-2 at GAS 16 (a fail); with
``"grad_accum_dtype": "fp32"`` 1.3e-5 at GAS 16 on ZeRO-1 and ZeRO-2 alike (docs/guides/gas_check.md).
"""

import math

FIX = '"data_types": {"grad_accum_dtype": "fp32"}'
# The most bf16 accumulation was seen to move a step-1 update (Adam at GAS 16, one element's sign flipped: 6.4e-2).
# An error several times that is a mistake of the engine, not rounding: it is not put down to accumulation.
ROUNDING_LIMIT = 1e-1


def accumulates_in_bf16(config):
    """True when the engine will sum micro-batch gradients in bf16 (the model's dtype by default)."""
    if not config.get("bf16", {}).get("enabled", False):
        return False
    accum = str(config.get("data_types", {}).get("grad_accum_dtype") or "bf16").lower()
    return accum in ("bf16", "bfloat16", "torch.bfloat16")


def _change(config):
    stage = config.get("zero_optimization", {}).get("stage", 0)
    if stage == 0:
        # Without ZeRO, DeepSpeed refuses bf16 weights with fp32 accumulation (an unsupported mix).
        return f"ZeRO stage 1 or more with {FIX}"
    return FIX


def by_gas(results):
    """``{gas: worst step-1 update error over the splits with that GAS}``, in GAS order (splits compared with
    themselves left out)."""
    worst = {}
    for result in results:
        if result.compared_with == "itself":  # without a reference, the first split's error is 0 by construction
            continue
        error = result.update_errors[0] if result.update_errors else float("nan")
        worst[result.gas] = max(worst.get(result.gas, 0.0), error)
    return dict(sorted(worst.items()))


def reading(config, results):
    """``(note, cause)``: a note on the accumulation dtype when the check runs GAS > 1 in bf16 (None
    otherwise), and the cause to give failing splits when bf16 accumulation explains them: every
    failing split accumulates (GAS > 1), the step-1 error grows with GAS (twice from the smallest GAS to the
    largest) and stays within ROUNDING_LIMIT (None otherwise)."""
    if not accumulates_in_bf16(config) or max((r.gas for r in results), default=1) == 1:
        return None, None
    measured = {gas: error for gas, error in by_gas(results).items() if not math.isnan(error)}
    errors = ", ".join(f"GAS {gas}: {error:.1e}" for gas, error in measured.items())
    # Say it grows only where it does: Adam can make every split's error the same rounding's (docs/guides/gas_check.md).
    values = list(measured.values())
    grows = len(values) > 1 and values[-1] >= 2 * values[0]
    growth = "" if len(values) < 2 else ", growing with GAS" if grows else ", not growing with GAS here"
    note = (f"gradients accumulate in bf16 (data_types.grad_accum_dtype unset: the model's dtype): each "
            f"micro-batch's addition rounds the sum; step-1 update error {errors}{growth}; {_change(config)} "
            "accumulates in fp32")
    failing = [r for r in results if not r.passed]
    # A cause only where the numbers show it: only splits that accumulate fail, the error grows with GAS as
    # rounding once per micro-batch does, and no failing split is off by more than rounding can be.
    if (not failing or any(r.gas == 1 for r in failing) or not grows
            or any(max(r.update_errors, default=0.0) > ROUNDING_LIMIT for r in failing)):
        return note, None
    gas_1 = ", GAS 1 passes" if any(r.gas == 1 for r in results) else ""
    cause = (f"likely cause: bf16 gradient accumulation (each micro-batch's gradient added to a sum with 8 "
             f"significant bits; only splits with GAS > 1 fail{gas_1}): set {_change(config)}")
    return note, cause
