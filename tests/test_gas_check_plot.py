# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""ds_gas_check --plot reads at a glance: the expected curves are drawn over the splits (black, dashed), splits
that agree stay visible, and each tolerance line says its value and which splits it judges."""

from types import SimpleNamespace

import pytest

pytest.importorskip("matplotlib")

from deepspeed.gafix.gas_check.plot import plot_check  # noqa: E402


def result(name, off, tolerance, passed=True, steps=3):
    expected = [1.0 - 0.1 * i for i in range(steps)]
    return SimpleNamespace(name=name,
                           losses=[e + off * i for i, e in enumerate(expected)],
                           expected_losses=expected,
                           norms=[2 * e + off * i for i, e in enumerate(expected)],
                           expected_norms=[2 * e for e in expected],
                           update_errors=[1e-7 + off] * steps,
                           passed=passed,
                           tolerance=tolerance,
                           compared_with="fp64 reference")


def test_expected_on_top_and_every_tolerance_labelled(tmp_path, monkeypatch):
    import matplotlib.figure
    drawn = {}

    def keep(fig, path, **kwargs):
        loss_ax, _, error_ax = fig.axes
        drawn["texts"] = [t.get_text() for t in error_ax.texts]
        drawn["alignment"] = {t.get_horizontalalignment() for t in error_ax.texts}
        drawn["top"] = error_ax.get_ylim()[1]
        drawn["lines"] = [(line.get_color(), line.get_linestyle(), line.get_zorder(), line.get_markersize())
                          for line in loss_ax.get_lines() if len(line.get_xdata())]  # not the legend's entry
        drawn["legend"] = [t.get_text() for t in loss_ax.get_legend().get_texts()]

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    plot_check(tmp_path / "check.png",
               [result("4x4x2", 0, 1e-5),
                result("8x2x2", 0, 1e-5),
                result("2x8x2", 0.05, 1e-3, passed=False)], "title")
    assert drawn["texts"] == ["tolerance 1e-05: 4x4x2, 8x2x2 ", "tolerance 1e-03: 2x8x2 "]
    # Right-aligned, clear of the tick labels on the left, and inside the axis above the highest line.
    assert drawn["alignment"] == {"right"} and drawn["top"] >= 3 * 1e-3
    expected = [line for line in drawn["lines"] if line[0] == "black"]
    observed = [line for line in drawn["lines"] if line[0] != "black"]
    assert expected and all(line[2] > max(o[2] for o in observed) for line in expected)
    sizes = [line[3] for line in observed]
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == len(sizes)
    assert "expected (fp64 reference)" in drawn["legend"]
