"""The report's figures (seaborn on matplotlib's Agg backend), each plotting exactly the values of
the table beside it: one row per (variant, length), no aggregation."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from ..measure.metrics import METRICS
from .output import writing

DPI = 100
SCALING_METRICS = ("time_median", "peak_bytes")  # the scaling plot's panels


def axis_label(metric: str, label: str = "") -> str:
    """`label [unit]` of a catalogued metric, in the unit the report shows it in."""
    spec = METRICS[metric]
    return f"{label or spec.label} [{spec.display_unit}]"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    try:
        with writing(path):
            fig.savefig(path, dpi=DPI)
    finally:
        _pyplot().close(fig)
    return path


def scaling_plot(ok: Any, setting: str, path: Path) -> Path | None:
    """Time (with IQR bars) and peak memory against length, log-log, one line per variant."""
    import seaborn as sns

    plt = _pyplot()
    panels = [(m, axis_label(m), METRICS[m].scale) for m in SCALING_METRICS]
    data = []
    for _, r in ok.iterrows():
        for metric, _, scale in panels:
            if metric in r["metrics"]:
                iqr = r["metrics"].get("time_iqr") if metric == "time_median" else None
                data.append(
                    {
                        "panel": metric,
                        "variant": r["variant"],
                        "L": r["seq_len"],
                        "y": r["metrics"][metric] / scale,
                        "iqr": iqr / scale if iqr is not None else None,
                    }
                )
    if not data:
        return None
    import pandas as pd

    frame = pd.DataFrame(data)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    lengths = sorted(frame["L"].unique())
    for ax, (metric, label, _) in zip(axes, panels):
        part = frame[frame["panel"] == metric]
        if part.empty:
            ax.set_visible(False)
            continue
        sns.lineplot(
            data=part,
            x="L",
            y="y",
            hue="variant",
            style="variant",
            markers=True,
            dashes=False,
            errorbar=None,
            estimator=None,
            ax=ax,
        )
        for _, r in part[part["iqr"].notna()].iterrows():
            ax.errorbar(r["L"], r["y"], yerr=r["iqr"] / 2, fmt="none", ecolor="gray", lw=1)
        ax.set(xscale="log", yscale="log", xlabel="sequence length L", ylabel=label)
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.minorticks_off()
        ax.legend(fontsize=7)
    fig.suptitle(textwrap.fill(setting, 110), fontsize=9)
    return _save(fig, path)


def pareto_plot(points: Any, front: list[bool], x: str, y: str, title: str, path: Path) -> Path:
    """Cost (x, log) against quality (y); the Pareto front joined and circled."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.6))
    ax.scatter(points[x], points[y], color="tab:blue", zorder=2)
    for _, r in points.iterrows():
        ax.annotate(r["label"], (r[x], r[y]), fontsize=7, xytext=(4, 3), textcoords="offset points")
    front_pts = points[front].sort_values(x)
    ax.plot(front_pts[x], front_pts[y], color="tab:red", lw=1.5, zorder=1, label="Pareto front")
    ax.scatter(front_pts[x], front_pts[y], s=120, facecolors="none", edgecolors="tab:red", zorder=3)
    ax.set(xscale="log", xlabel=x, ylabel=y, title=title)
    ax.legend(fontsize=8)
    return _save(fig, path)


def heatmaps(ours: Any, paper: Any, path: Path) -> Path:
    """Two train x eval accuracy matrices side by side (percent), ours and the paper's."""
    import seaborn as sns

    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8))
    for ax, (title, frame) in zip(axes, (("measured here", ours), ("published (paper)", paper))):
        sns.heatmap(
            frame * 100,
            annot=True,
            fmt=".1f",
            vmin=0,
            vmax=100,
            cmap="viridis",
            cbar=False,
            ax=ax,
        )
        ax.set(title=f"accuracy [%], {title}", xlabel="evaluated with", ylabel="trained with")
    return _save(fig, path)


def fidelity_plot(
    points: Any, fronts: dict[str, dict[Any, bool]], setting: str, path: Path
) -> Path:
    """approx_error against time (log-log), one panel per input family, one colour per variant and
    one marker per length; each length's Pareto front (lower time and error) joined in red."""
    import seaborn as sns

    plt = _pyplot()
    families = list(dict.fromkeys(points["inputs"]))
    fig, axes = plt.subplots(1, len(families), figsize=(5.5 * len(families), 4.4), squeeze=False)
    for ax, inputs in zip(axes[0], families):
        part = points[points["inputs"] == inputs]
        sns.scatterplot(data=part, x="time", y="approx_error", hue="variant", style="L", ax=ax)
        metric = part["metric"].iloc[0]
        on = part[[fronts[metric].get(i, False) for i in part["index"]]]
        for _, front in on.groupby("L"):
            front = front.sort_values("time")
            ax.plot(front["time"], front["approx_error"], color="tab:red", lw=1, zorder=1)
        ax.scatter(on["time"], on["approx_error"], s=120, facecolors="none", edgecolors="tab:red")
        ax.set(
            xscale="log",
            yscale="log",
            xlabel=axis_label("time_median"),
            ylabel=f"approx_error ({inputs} inputs)",
            title=f"{inputs} inputs (circled: Pareto front per length)",
        )
        ax.legend(fontsize=7)
    fig.suptitle(textwrap.fill(setting, 110), fontsize=9)
    return _save(fig, path)
