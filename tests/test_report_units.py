"""The report's plots show metrics in the unit and scale the metric catalogue gives them."""

from __future__ import annotations

import pytest

pytest.importorskip("pandas")
pytest.importorskip("seaborn")

import pandas as pd

from attention_zoo.measure.metrics import METRICS
from attention_zoo.report import plots


@pytest.mark.slow
def test_scaling_plot_axes_use_the_catalogue_units(tmp_path, monkeypatch):
    saved = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: saved.append(fig) or path)
    ok = pd.DataFrame(
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
    plots.scaling_plot(ok, "setting", tmp_path / "p.png")
    time_ax, memory_ax = saved[0].axes[:2]
    time, memory = METRICS["time_median"], METRICS["peak_bytes"]
    # the bench table's column names, as in every table of the report
    assert time_ax.get_ylabel() == f"{time.column} [{time.display_unit}], log scale"
    assert memory_ax.get_ylabel() == f"{memory.column} [{memory.display_unit}], log scale"
    assert list(time_ax.lines[0].get_ydata()) == pytest.approx([2.0, 8.0])  # ms
    assert list(memory_ax.lines[0].get_ydata()) == pytest.approx([3.0, 12.0])  # MiB
    plots.pyplot().close(saved[0])
