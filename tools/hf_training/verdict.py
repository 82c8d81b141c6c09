# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""How one case's outcome (as the worker reports it) is judged against the fp64 reference."""

# fp32 on the CPU: the applied gradient is read off fp32 weights, (w0 - w1) / lr, ~8e-7 seen.
TOLERANCE = 1e-5


def relative(got, want):
    return abs(got - want) / abs(want)


def problems(case, outcome):
    """Every way this case's step was measured agrees with the reference; one message per mismatch."""
    found = []
    expected_kwargs = case.loss_kwargs == "model"
    if outcome["accepts_loss_kwargs"] != expected_kwargs:
        found.append(f"model_accepts_loss_kwargs was {outcome['accepts_loss_kwargs']}, not {expected_kwargs}")
    steps = len(outcome["reference_norm"])
    for name in ("factor", "rel_error", "hook_norm", "logged_loss", "logged_grad_norm"):
        if len(outcome[name]) != steps:
            found.append(f"{name}: {len(outcome[name])} steps recorded, the reference has {steps}")
    for step in range(steps):
        at = f"step {step + 1}"
        ref_norm, ref_loss = outcome["reference_norm"][step], outcome["reference_loss"][step]
        if outcome["rel_error"][step] > TOLERANCE:
            found.append(f"{at}: applied gradient x{outcome['factor'][step]:.4f} the reference's "
                         f"(norm {outcome['applied_norm'][step]:.6f} vs {ref_norm:.6f}, "
                         f"relative error {outcome['rel_error'][step]:.2e})")
        if relative(outcome["hook_norm"][step], ref_norm) > TOLERANCE:
            found.append(f"{at}: the optimizer received a gradient of norm {outcome['hook_norm'][step]:.6f}, "
                         f"reference {ref_norm:.6f}")
        if relative(outcome["logged_loss"][step], ref_loss) > TOLERANCE:
            found.append(f"{at}: logged loss {outcome['logged_loss'][step]:.6f}, reference {ref_loss:.6f}")
        logged_norm = outcome["logged_grad_norm"][step]
        # Upstream's engine reports no norm for fp32 ZeRO-0, so the Trainer logs none: allowed, not checked (the fork
        # reports it, patch Report-the-ZeRO-0-fp32-global-grad-norm-from-one-fus; tests/test_global_grad_norm.py checks
        # that).
        if logged_norm is not None and relative(logged_norm, ref_norm) > TOLERANCE:
            found.append(f"{at}: logged grad_norm {logged_norm:.6f}, reference {ref_norm:.6f}")
        versus = outcome["rel_error_vs_no_deepspeed"]
        if versus is not None and versus[step] > 2 * TOLERANCE:
            found.append(f"{at}: applied gradient differs from the same split without DeepSpeed "
                         f"(relative {versus[step]:.2e})")
    return found
