"""Turn stored measurements into a published comparison: Markdown tables plus seaborn plots.

Only stored numbers appear; a case that did not produce a number shows its status (OOM, error,
skipped) in the table cell instead, so nothing is silently missing or invented.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..labels import variant_label
from ..measure.metrics import METRICS, plotted, reported
from ..measure.status import OK, STATUS_TEXT

log = logging.getLogger(__name__)

# What the report shows: the metric catalogue's reported and plotted metrics.
DISPLAY = tuple(m.name for m in reported())
PLOTTED = tuple(m.name for m in plotted())


@dataclass
class ReportFiles:
    """What build_report wrote."""

    markdown: Path
    plots: list[Path] = field(default_factory=list)


def _bench_frame(df: Any) -> Any:
    """Rows of bench cases with the columns the tables need (variant, seq_len, mode, ...)."""
    needed = {"cfg.backend", "cfg.seq_len", "cfg.mode"}
    if not len(df) or not needed <= set(df.columns):
        return df.iloc[0:0]
    bench = df[df["cfg.seq_len"].notna()].copy()
    bench["variant"] = [
        variant_label(b, _options_of(row)) for b, row in zip(bench["cfg.backend"], bench["config"])
    ]
    labels = bench.get("cfg.label")
    if labels is not None:
        bench["variant"] = [  # a model's label names it; its options still tell variants apart
            variant_label(lab, _options_of(row)) if isinstance(lab, str) and lab else v
            for lab, v, row in zip(labels, bench["variant"], bench["config"])
        ]
    bench["seq_len"] = bench["cfg.seq_len"].astype(int)
    bench["group"] = bench["cfg.target"].fillna("") + " / " + bench["cfg.mode"]
    return bench


def _options_of(config_json: str) -> dict[str, Any]:
    return json.loads(config_json).get("options") or {}


def _cell(values: Any, statuses: Any, divisor: float) -> str:
    finite = [v for v in values if v == v and v is not None]
    if finite:
        return (
            f"{finite[0] / divisor:,.3g}"
            if finite[0] / divisor < 1000
            else f"{finite[0] / divisor:,.0f}"
        )
    status = next((s for s in statuses if s != OK), None)
    return STATUS_TEXT.get(status, "-")


def _pivot_markdown(bench: Any, metric: str) -> str:
    import pandas as pd

    spec = METRICS[metric]
    title, unit, divisor = spec.label, spec.display_unit, spec.scale
    out = []
    for group, part in bench.groupby("group", sort=True):
        rows = part[(part["metric"] == metric) | part["metric"].isna()]
        if rows["metric"].eq(metric).sum() == 0:
            continue
        lengths = sorted(rows["seq_len"].unique())
        table = {}
        for variant, vpart in rows.groupby("variant", sort=True):
            table[variant] = {
                n: _cell(list(c["value"]), list(c["status"]), divisor)
                for n, c in vpart.groupby("seq_len")
            }
        frame = pd.DataFrame(table).T.reindex(columns=lengths).fillna("-")
        frame.columns = [f"L={n}" for n in lengths]
        out.append(f"#### {title} [{unit}], {group}\n\n{frame.to_markdown()}\n")
    return "\n".join(out)


def _plot(bench: Any, metric: str, out_dir: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    spec = METRICS[metric]
    title, unit, divisor = spec.label, spec.display_unit, spec.scale
    data = bench[(bench["metric"] == metric) & (bench["status"] == OK)].copy()
    if data.empty:
        return None
    data["shown"] = data["value"] / divisor
    groups = sorted(data["group"].unique())
    fig, axes = plt.subplots(1, len(groups), figsize=(5.5 * len(groups), 4.2), squeeze=False)
    for ax, group in zip(axes[0], groups):
        sns.lineplot(
            data=data[data["group"] == group],
            x="seq_len",
            y="shown",
            hue="variant",
            style="variant",
            markers=True,
            dashes=False,
            ax=ax,
        )
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="sequence length",
            ylabel=f"{title} [{unit}]",
            title=group,
        )
        lengths = sorted(data.loc[data["group"] == group, "seq_len"].unique())
        ax.set_xticks(lengths, [str(n) for n in lengths], minor=False)
        ax.minorticks_off()
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = out_dir / f"{metric}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _environment_lines(df: Any) -> list[str]:
    lines = []
    for col, label in (
        ("device_name", "device"),
        ("torch_version", "torch"),
        ("threads", "threads"),
        ("git_commit", "git commit"),
        ("run_id", "run"),
    ):
        if col in df:
            values = sorted({str(v) for v in df[col].dropna()})
            lines.append(f"- {label}: {', '.join(values) if values else '-'}")
    return lines


def _problems(df: Any) -> str:
    bad = df[df["status"] != OK].drop_duplicates("case_key")
    if bad.empty:
        return ""
    lines = ["### Cases without numbers", "", "| case | status | reason |", "|---|---|---|"]
    for _, r in bad.iterrows():
        reason = str(r.get("error") or "").replace("|", "/").replace("\n", " ")[:200]
        cfg = json.loads(r["config"])
        name = variant_label(cfg.get("backend", "?"), cfg.get("options")) + (
            f", L={cfg['seq_len']}" if "seq_len" in cfg else ""
        )
        lines.append(
            f"| {name} {cfg.get('mode', '')} "
            f"| {STATUS_TEXT.get(r['status'], r['status'])} | {reason} |"
        )
    return "\n".join(lines) + "\n"


def _other_results(df: Any, bench: Any) -> str:
    """Rows that are not bench cases (e.g. task accuracy): listed plainly, metric by metric."""
    rest = df[~df.index.isin(bench.index) & df["metric"].notna()]
    if rest.empty:
        return ""
    lines = ["### Other results", "", "| case | metric | value | unit |", "|---|---|---|---|"]
    for _, r in rest.iterrows():
        cfg = json.loads(r["config"])
        name = ", ".join(f"{k}={v}" for k, v in cfg.items() if not isinstance(v, (dict, list)))[
            :120
        ]
        lines.append(f"| {name} | {r['metric']} | {r['value']:.4g} | {r['unit']} |")
    return "\n".join(lines) + "\n"


def build_report(
    df: Any, out_dir: str | Path, *, title: str = "attention-zoo comparison"
) -> ReportFiles:
    """Write report.md (+ PNG plots) into out_dir from a ResultStore.to_dataframe() DataFrame."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    bench = _bench_frame(df)
    plots = (
        [p for m in PLOTTED if (p := _plot(bench, m, out_dir)) is not None] if len(bench) else []
    )
    parts = [
        f"# {title}",
        "",
        "Every number below was measured and stored by attention-zoo; "
        "cells without a number say why (OOM, error, n/a = skipped).",
        "",
        "## Environment",
        "",
        *_environment_lines(df),
        "",
    ]
    if len(bench):
        parts += ["## Cost", ""]
        parts += [f"![{p.stem}]({p.name})\n" for p in plots]
        for metric in DISPLAY:
            if text := _pivot_markdown(bench, metric):
                parts.append(text)
    parts.append(_problems(df))
    parts.append(_other_results(df, bench))
    md = out_dir / "report.md"
    md.write_text("\n".join(p for p in parts if p is not None).rstrip() + "\n")
    log.info("report written to %s", md)
    return ReportFiles(markdown=md, plots=plots)
