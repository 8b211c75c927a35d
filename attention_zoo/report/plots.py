"""The report's figures (seaborn on matplotlib, drawn without pyplot, so the caller's matplotlib
is left alone), each plotting exactly the values of the table beside it: one row per (variant,
length), no aggregation. One theme for all; what a variant computes is its line style and marker
(exact solid circles, not exact dashed triangles or squares); names sit in a legend beside the
axes, never on the points; every figure has a caption (CAPTIONS) saying what to look for."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..measure.labels import UNKNOWN_KIND, backend_kind, kind_text
from ..measure.metrics import METRICS
from .output import writing

DPI = 100
SCALING_METRICS = ("time_median", "peak_bytes")  # the scaling plot's panels
THEME = {"style": "whitegrid", "context": "paper", "palette": "colorblind"}
# what a variant computes (labels.backend_kind) -> (marker, dashes): exact solid, others dashed
KIND_STYLE = {
    "full": ("o", ""),
    "pattern": ("s", (4, 2)),
    "recurrent": ("D", (6, 2)),
    "approximate": ("^", (2, 2)),
    UNKNOWN_KIND: ("X", (1, 1)),
}
# file-name prefix -> the one-line caption of every figure of that kind (a reproduction's own
# figures carry their captions in their sections)
CAPTIONS = {
    "scaling-": (
        "Look for the lines that bend up least: their slope is the exponent in the table below; "
        "where a dashed (not exact) line passes under a solid (exact) one is a crossover."
    ),
    "fidelity-": (
        "Look toward the lower left: faster and closer to full attention; circled points are "
        "the Pareto front of their length (no other variant both faster and more faithful)."
    ),
    "decoding-": (
        "Look for flat lines: a token that costs the same at any context (running sums, a window) "
        "beside a KV cache's linear growth; dashed lines are not exact, `(recompute)` lines run "
        "the whole prefix for every token."
    ),
    "pareto-": (
        "Look toward the upper left: more accurate for less time per step; the red line joins "
        "the Pareto front (no other run both faster and more accurate)."
    ),
}


def caption(path: Path) -> str:
    """The caption of a figure file written by this module ('' for one it does not know)."""
    return next((text for prefix, text in CAPTIONS.items() if path.name.startswith(prefix)), "")


def kind_style(kind: str) -> tuple[str, Any]:
    """(marker, dashes) of a variant that computes `kind`."""
    return KIND_STYLE.get(kind, KIND_STYLE[UNKNOWN_KIND])


def axis_label(metric: str, label: str = "") -> str:
    """`label [unit]` of a catalogued metric, in the unit the report shows it in."""
    spec = METRICS[metric]
    return f"{label or spec.label} [{spec.display_unit}]"


@contextmanager
def figure(nrows: int = 1, ncols: int = 1, **subplots: Any) -> Iterator[tuple[Any, Any]]:
    """(figure, axes) in the report's theme, drawn without pyplot: the caller's backend, open
    figures and matplotlib settings stay as they were (a notebook's too). Save inside the block:
    the theme holds only there. subplots: `figsize`, then Figure.subplots' keywords."""
    import matplotlib
    from matplotlib.figure import Figure

    figsize = subplots.pop("figsize", None)
    with matplotlib.rc_context(theme()):
        fig = Figure(figsize=figsize)
        yield fig, fig.subplots(nrows, ncols, **subplots)


def theme() -> dict[str, Any]:
    """THEME as matplotlib settings: what seaborn.set_theme would set for the whole process."""
    import seaborn as sns
    from matplotlib import cycler

    return {
        **sns.plotting_context(THEME["context"]),
        **sns.axes_style(THEME["style"], rc={"font.family": "sans-serif"}),
        "axes.prop_cycle": cycler("color", sns.color_palette(THEME["palette"])),
    }


def _legend_outside(fig: Any, ax: Any, title: str = "") -> None:
    """One legend to the right of the axes (names never overlap the data or each other)."""
    handles, labels = ax.get_legend_handles_labels()
    if ax.get_legend() is not None:
        ax.get_legend().remove()
    if handles:
        fig.legend(
            handles,
            labels,
            loc="center left",
            bbox_to_anchor=(1.0, 0.5),
            fontsize=7,
            title=title or None,
            title_fontsize=7,
            frameon=False,
        )


def save_figure(fig: Any, path: Path) -> Path:
    """Write `fig` to `path` (laid out, at the report's resolution) and close it."""
    fig.tight_layout()
    with writing(path):
        fig.savefig(path, dpi=DPI, bbox_inches="tight")
    return path


def scaling_plot(
    ok: Any,
    setting: str,
    path: Path,
    metrics: dict[str, str] | None = None,
    xlabel: str = "sequence length L",
) -> Path | None:
    """Time (with IQR bars) and peak memory (or `metrics`: metric -> axis title) against length,
    log-log, one line per variant; exact variants solid with circles, the others dashed
    (pattern: squares, approximate: triangles); one legend for both panels."""
    import seaborn as sns

    titles = metrics or {m: METRICS[m].column for m in SCALING_METRICS}
    panels = [(m, axis_label(m, title), METRICS[m].scale) for m, title in titles.items()]
    data = []
    for _, r in ok.iterrows():
        for metric, _, scale in panels:
            if metric in r["metrics"]:
                iqr = r["metrics"].get("time_iqr") if metric == "time_median" else None
                data.append(
                    {
                        "panel": metric,
                        "variant": f"{r['variant']} ({kind_text(r['computes'])})",
                        "computes": r["computes"],
                        "L": r["seq_len"],
                        "y": r["metrics"][metric] / scale,
                        "iqr": iqr / scale if iqr is not None else None,
                    }
                )
    if not data:
        return None
    import pandas as pd

    order = list(KIND_STYLE)  # exact first, then pattern, then approximate
    frame = pd.DataFrame(data)
    frame = frame.assign(
        rank=[order.index(k) if k in order else len(order) for k in frame["computes"]]
    )
    frame = frame.sort_values(["rank", "variant", "L"])
    names = list(dict.fromkeys(frame["variant"]))
    kinds = dict(zip(frame["variant"], frame["computes"]))
    markers = {v: kind_style(kinds[v])[0] for v in names}
    dashes = {v: kind_style(kinds[v])[1] for v in names}
    with figure(1, 2, figsize=(11, 4.4)) as (fig, axes):
        lengths = sorted(frame["L"].unique())
        shown = None
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
                hue_order=names,
                style="variant",
                style_order=names,
                markers=markers,
                dashes=dashes,
                errorbar=None,
                estimator=None,
                ax=ax,
            )
            for _, r in part[part["iqr"].notna()].iterrows():
                ax.errorbar(r["L"], r["y"], yerr=r["iqr"] / 2, fmt="none", ecolor="gray", lw=1)
            ax.set(
                xscale="log",
                yscale="log",
                xlabel=f"{xlabel} (log scale)",
                ylabel=f"{label}, log scale",
            )
            ax.set_xticks(
                lengths, [str(n) for n in lengths], rotation=45 if len(lengths) > 5 else 0
            )
            ax.minorticks_off()
            shown = ax if shown is None else shown
            if ax.get_legend() is not None:
                ax.get_legend().remove()
        if shown is not None:
            _legend_outside(fig, shown, "variant (computes)")
        fig.suptitle(textwrap.fill(setting, 110), fontsize=9)
        return save_figure(fig, path)


def pareto_plot(points: Any, front: list[bool], x: str, y: str, title: str, path: Path) -> Path:
    """Cost (x, log) against quality (y), one colour per point's label (`label` column) in a
    legend, its marker from what its backend computes (`backend` column); the Pareto front
    joined and circled."""
    import seaborn as sns

    with figure(figsize=(7.5, 4.4)) as (fig, ax):
        kinds = [backend_kind(str(b)) for b in points.get("backend", points["label"])]
        data = points.assign(computes=[kind_text(k) for k in kinds], **{"run": points["label"]})
        markers = {kind_text(k): kind_style(k)[0] for k in set(kinds)}
        sns.scatterplot(
            data=data, x=x, y=y, hue="run", style="computes", markers=markers, s=60, ax=ax, zorder=2
        )
        front_pts = points[front].sort_values(x)
        ax.plot(front_pts[x], front_pts[y], color="tab:red", lw=1.5, zorder=1, label="Pareto front")
        ax.scatter(
            front_pts[x], front_pts[y], s=160, facecolors="none", edgecolors="tab:red", zorder=3
        )
        ax.set(xscale="log", xlabel=f"{x} (log scale)", ylabel=y, title=title)
        _legend_outside(fig, ax)
        return save_figure(fig, path)


def heatmaps(ours: Any, paper: Any, path: Path) -> Path:
    """Two train x eval accuracy matrices side by side (percent), ours and the paper's."""
    import seaborn as sns

    with figure(1, 2, figsize=(12, 3.8)) as (fig, axes):
        for ax, (title, frame) in zip(
            axes, (("measured here", ours), ("published (paper)", paper))
        ):
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
            ax.tick_params(axis="x", labelrotation=30)
        return save_figure(fig, path)


def fidelity_plot(
    points: Any, fronts: dict[str, dict[Any, bool]], setting: str, path: Path
) -> Path:
    """approx_error against time (log-log), one panel per input family, one colour per variant and
    one marker per length; each length's Pareto front (lower time and error) joined in red."""
    import seaborn as sns

    families = list(dict.fromkeys(points["inputs"]))
    with figure(1, len(families), figsize=(5.5 * len(families), 4.2), squeeze=False) as (fig, axes):
        for ax, inputs in zip(axes[0], families):
            part = points[points["inputs"] == inputs]
            sns.scatterplot(data=part, x="time", y="approx_error", hue="variant", style="L", ax=ax)
            metric = part["metric"].iloc[0]
            on = part[[fronts[metric].get(i, False) for i in part["index"]]]
            for _, front in on.groupby("L"):
                front = front.sort_values("time")
                ax.plot(front["time"], front["approx_error"], color="tab:red", lw=1, zorder=1)
            ax.scatter(
                on["time"], on["approx_error"], s=120, facecolors="none", edgecolors="tab:red"
            )
            ax.set(
                xscale="log",
                yscale="log",
                xlabel=f"{axis_label('time_median')} (log scale)",
                ylabel=f"approx_error, {inputs} inputs (log scale)",
                title=f"{inputs} inputs (circled: Pareto front per length)",
            )
            if ax.get_legend() is not None:
                ax.get_legend().remove()
        _legend_outside(fig, axes[0][0])
        fig.suptitle(textwrap.fill(setting, 110), fontsize=9)
        return save_figure(fig, path)
