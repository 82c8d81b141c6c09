# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The check's results as the table and notes ``ds_gas_check`` prints."""

import math

from .verdict import MAX_TOLERANCE


def format_results(results, title):
    return "\n".join([title] + table(results) + tolerance_notes(results) + split_notes(results) +
                     comparison_notes(results) + engine_notes(results))


def table(results):
    """One row per split: its norm error, its update errors at the first and last step, its verdict."""
    first = results[0].first_step
    header = [
        "split (micro x GAS x ranks)", "norm error", f"update error step {first}",
        f"step {first + len(results[0].update_errors) - 1}", "verdict"
    ]
    rows_ = [header]
    for r in results:
        norm = "not reported" if math.isnan(r.norm_error) else f"{r.norm_error:.1e}"
        rows_.append([r.name, norm, f"{r.update_errors[0]:.1e}", f"{r.update_errors[-1]:.1e}", r.verdict])
    widths = [max(len(row[i]) for row in rows_) for i in range(len(header))]
    return [" | ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows_]


def tolerance_notes(results):
    """Where the tolerance was raised over the dtype's (rounding alone moves this model more), and the splits it
    leaves unresolved."""
    lines = []
    raised = [r for r in results if not math.isnan(r.noise_floor) and r.tolerance > r.tolerance_for_dtype]
    if raised:
        worst = max(raised, key=lambda r: r.noise_floor)
        lines.append(
            f"tolerance: {max(r.tolerance for r in raised):.1e}, {worst.floor_factor:g} x what rounding alone "
            f"gives this model in plain PyTorch (up to {worst.noise_floor:.1e}), above the dtype's "
            f"{worst.tolerance_for_dtype:.0e}")
        if worst.floor_factor * worst.noise_floor > MAX_TOLERANCE:
            lines.append(
                f"note: rounding alone moves this model's update by {worst.noise_floor:.1e} in this precision: "
                f"the tolerance stays at {MAX_TOLERANCE:.0e}, so a split failing by less may be rounding; a "
                "check in fp32 (or with --optimizer sgd) resolves finer errors")
    unresolved = [r for r in results if r.unresolved]
    if unresolved:
        lines.append(
            f"UNRESOLVED: {', '.join(r.name for r in unresolved)}: the grad norm agrees, but the update differs by "
            f"more than {MAX_TOLERANCE:.0e} and no more than this precision's rounding gives this model: a GAS error "
            "of that size cannot be told from rounding here; check the same config in fp32")
    return lines


def split_notes(results):
    """Per split: the weights a resumed run loaded, and steps over the tolerance that plain PyTorch rounds alike."""
    lines = []
    for r in results:
        if not math.isnan(r.restored_error):
            lines.append(f"  {r.name}: the weights it loaded: {r.restored_error:.1e} off the fp64 reference's after "
                         f"step {r.first_step - 1}" +
                         ("" if r.restored_ok else f", over the tolerance {r.tolerance:.1e}"))
        if r.steps_matching_floor:
            step = r.steps_matching_floor[0]
            at = step - r.first_step
            lines.append(
                f"  {r.name}: update error {r.update_errors[at]:.1e} at step {step} is over the tolerance "
                f"{r.tolerance:.1e}, but within {r.floor_update_errors[at]:.1e} of plain PyTorch in this "
                "precision on the same device and micro-batches: the precision's rounding (Adam turns a "
                "near-zero gradient's rounding into a full-size step; weights stored in bf16 or fp16 lose an update "
                "under half their last bit), not the engine")
    return lines


def comparison_notes(results):
    """Buckets too small to overlap, and what the splits were compared with where there was no fp64 reference."""
    lines = []
    if results[0].small_buckets:
        lines.append(results[0].small_buckets)
    compared = {r.compared_with for r in results if r.compared_with != "itself"}
    if compared != {"fp64 reference"}:
        lines.append(f"compared with: {', '.join(sorted(compared))} (no fp64 reference: the model is too large for "
                     "one on every rank, or --no-reference; errors the same at every split are not seen this way: "
                     "docs/guides/gas_check.md)")
    return lines


def engine_notes(results):
    """What the engine did: each split's diagnosis and skipped steps, and the mean-mode loss gap."""
    lines = []
    for r in results:
        lines += [f"  {r.name}: {line}" for line in r.diagnosis]
        if r.skipped_steps:
            lines.append(f"  {r.name}: the engine skipped {r.skipped_steps} of {len(r.norms)} step(s) for non-finite "
                         "gradients (inf/nan): those steps did not update the weights")
    gaps = [r for r in results if r.loss_normalization_gap > r.tolerance]
    if gaps:
        lines.append("note: the loss is a mean over each micro-batch's own items and their counts vary, so the split "
                     "changes the loss itself: each split's expected update differs from the global-batch mean's by " +
                     ", ".join(f"{r.loss_normalization_gap:.1e} ({r.name})" for r in gaps) +
                     ". DeepSpeed averages micro-batch means by design and the check expects that; if the split must "
                     "not matter, set \"loss_normalization\": \"per_item\" and pass each micro-batch's loss sum "
                     "with engine.backward(loss_sum, num_items=n) (docs/guides/per_item_loss.md).")
    return lines
