"""The report's plots show metrics in the unit and scale the metric catalogue gives them."""

from __future__ import annotations

import pytest

pytest.importorskip("pandas")
pytest.importorskip("seaborn")

import pandas as pd

from attention_zoo.measure.metrics import METRICS
from attention_zoo.report import plots


def _two_lengths() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "variant": ["full", "full"],
            "computes": ["full", "full"],
            "seq_len": [256, 512],
            "metrics": [
                {"time_median": 0.002, "time_iqr": 0.0001, "peak_bytes": 3 * 2**20},
                {"time_median": 0.008, "time_iqr": 0.0002, "peak_bytes": 12 * 2**20},
            ],
        }
    )


@pytest.mark.slow
def test_scaling_plot_axes_use_the_catalogue_units(tmp_path, monkeypatch):
    saved = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: saved.append(fig) or path)
    plots.scaling_plot(_two_lengths(), "setting", tmp_path / "p.png")
    time_ax, memory_ax = saved[0].axes[:2]
    time, memory = METRICS["time_median"], METRICS["peak_bytes"]
    # the bench table's column names, as in every table of the report
    assert time_ax.get_ylabel() == f"{time.column} [{time.display_unit}], log scale"
    assert memory_ax.get_ylabel() == f"{memory.column} [{memory.display_unit}], log scale"
    assert list(time_ax.lines[0].get_ydata()) == pytest.approx([2.0, 8.0])  # ms
    assert list(memory_ax.lines[0].get_ydata()) == pytest.approx([3.0, 12.0])  # MiB


@pytest.mark.slow
def test_plots_leave_the_callers_matplotlib_as_it_was(tmp_path, monkeypatch):
    """A report built from a notebook keeps the notebook's backend, open figures and settings,
    and its figures keep the report's theme whatever the caller's settings."""
    import matplotlib
    import matplotlib.pyplot as plt

    saved, save = [], plots.save_figure
    monkeypatch.setattr(plots, "save_figure", lambda fig, p: saved.append(fig) or save(fig, p))
    backend = matplotlib.get_backend()
    try:
        matplotlib.use("template")
        with matplotlib.rc_context({"axes.facecolor": "pink", "lines.linewidth": 7.0}):
            before, figures = dict(matplotlib.rcParams), plt.get_fignums()
            assert plots.scaling_plot(_two_lengths(), "setting", tmp_path / "p.png").stat().st_size
            assert matplotlib.get_backend() == "template" and plt.get_fignums() == figures
            assert dict(matplotlib.rcParams) == before
    finally:
        matplotlib.use(backend)
    time_ax = saved[0].axes[0]
    assert time_ax.get_facecolor() == matplotlib.colors.to_rgba("white")  # whitegrid, not pink
    assert time_ax.lines[0].get_linewidth() != 7.0
