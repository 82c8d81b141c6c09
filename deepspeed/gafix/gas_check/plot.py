# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""``--plot FILE.png``: loss, grad norm and update error per step, one line per split, and the reference.

Needs matplotlib (``pip install "deepspeed[plot]"``). The first two panels show whether a split's run
leaves the reference; the third, on a log scale with the tolerance drawn, shows by how much.
"""

import math


def pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ValueError(
            "--plot needs matplotlib: pip install 'deepspeed[plot]' (or pip install matplotlib)") from None
    matplotlib.use("Agg")  # files only: no display is needed or wanted
    import matplotlib.pyplot as plt
    return plt


def plot_check(path, results, title):
    """Draw ``results`` (one SplitResult per split) into ``path``."""
    plt = pyplot()
    steps = list(range(1, len(results[0].losses) + 1))
    fig, (loss_ax, norm_ax, error_ax) = plt.subplots(1, 3, figsize=(15, 4.6), constrained_layout=True)
    reference = results[0]
    label = "fp64 reference" if reference.compared_with == "fp64 reference" else f"split {reference.name}"
    for index, result in enumerate(results):
        draw_split(steps, index, result, loss_ax, norm_ax, error_ax)
    loss_ax.plot([], [], color="black", linestyle="--", linewidth=1, label=f"expected ({label})")
    if all(math.isnan(n) for r in results for n in r.norms):
        norm_ax.text(0.5,
                     0.5,
                     "the engine reports no grad norm\n(get_global_grad_norm() is None)",
                     transform=norm_ax.transAxes,
                     ha="center",
                     va="center",
                     color="red")
    draw_tolerances(steps, results, error_ax)
    loss_ax.set_title("loss (mean over micro-batches); black dashed: expected")
    norm_ax.set_title("global grad norm (reported); black dashed: expected")
    error_ax.set_title(f"update error vs {label}")
    for ax in (loss_ax, norm_ax, error_ax):
        ax.set_xlabel("step")
        ax.set_xticks(steps)
        ax.grid(True, alpha=0.3)
    loss_ax.legend(fontsize=8, title="micro x GAS x ranks", title_fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)


MARKERS = "osD^v<>p*h"


def draw_split(steps, index, result, loss_ax, norm_ax, error_ax):
    """One split's loss, grad norm and update error, and its own expectation on the first two."""
    # Markers shrink split by split: splits that agree draw concentric markers, none hidden under another.
    style = dict(marker=MARKERS[index % len(MARKERS)],
                 markersize=max(3, 10 - 2 * index),
                 color=f"C{index % 10}",
                 linestyle="-" if result.passed else ":",
                 label=f"{result.name} {'PASS' if result.passed else 'FAIL'}",
                 zorder=2)
    # Each split's own expectation (the reference averages the same micro-batches' losses, which differs
    # between splits when the loss is a mean over varying item counts), drawn thin and black on top: where a
    # split is right its line runs through the split's markers, where it is wrong the two part.
    expected = dict(color="black", linestyle="--", linewidth=1, zorder=3)
    loss_ax.plot(steps, result.expected_losses, **expected)
    loss_ax.plot(steps, result.losses, **style)
    if not any(math.isnan(n) for n in result.expected_norms):
        norm_ax.plot(steps, result.expected_norms, **expected)
    if not any(math.isnan(n) for n in result.norms):
        norm_ax.plot(steps, result.norms, **style)
    # An error of 0 (a split compared with itself) cannot sit on a log axis.
    error_ax.plot(steps, [max(e, 1e-12) for e in result.update_errors], **style)


def draw_tolerances(steps, results, error_ax):
    """One line per tolerance, each labelled with its value and the splits it judges, on a log axis.
    Right-aligned, clear of the axis' tick labels on the left; the axis reaches a little above the highest line, so
    that its label sits inside the plot."""
    tolerances = sorted({r.tolerance for r in results})
    for tol in tolerances:
        judged = ", ".join(r.name for r in results if r.tolerance == tol)
        error_ax.axhline(tol, color="red", linewidth=1, linestyle="--")
        error_ax.text(steps[-1],
                      tol,
                      f"tolerance {tol:.0e}: {judged} ",
                      color="red",
                      va="bottom",
                      ha="right",
                      fontsize=8)
    error_ax.set_yscale("log")
    low, high = error_ax.get_ylim()
    error_ax.set_ylim(low, max(high, 3 * tolerances[-1]))
