"""Headline and Scaling sections: time and peak memory per variant, ratios to the reference,
fitted power laws and crossover lengths. One table (and one plot) per setting: the parameters
that tell the setting apart are in its heading, the variant in each row."""

from __future__ import annotations

from typing import Any

from ..measure.metrics import METRICS, reported
from ..measure.peers import families, reference_backend
from .context import BUSY_MARK, TIME, UNSTABLE_MARK, Context, empty_section, trusted
from .document import Heading, Image, Para, Table
from .plots import scaling_plot

QUICK = "zoo bench --preset quick"
MEMORY = "peak_bytes"


def header(metric: str, short: str = "") -> str:
    """A column header: the catalogue's label (or `short`) with its display unit."""
    spec = METRICS[metric]
    return f"{short or spec.label} [{spec.display_unit}]"


def extra_metrics() -> list[str]:
    """The catalogue's reported metrics beyond time and peak memory (predicted memory, FLOPs)."""
    return [m.name for m in reported() if m.name not in (TIME, MEMORY)]


def settings(ctx: Context) -> list[tuple[str, Any]]:
    if ctx.bench.empty:
        return []
    return list(ctx.bench.groupby("setting", sort=True))


def _references(part: Any, backend: str, reference: str) -> Any:
    """The rows `backend`'s rows divide by: the variant labelled `reference`, or for a peer
    family ('hf') that family's peer of the same mechanism (lsh -> hf:lsh)."""
    if reference in families():
        return part[part["backend"] == (reference_backend(reference, backend) or "")]
    return part[part["label"] == reference]


def _reference_row(part: Any, seq_len: int, reference: str, backend: str = "") -> Any:
    refs = _references(part, backend, reference)
    refs = refs[(refs["seq_len"] == seq_len) & (refs["status"] == "ok")]
    return None if refs.empty else refs.iloc[-1]


def _ratio(ctx: Context, row: Any, ref: Any, metric: str) -> str:
    if ref is None or not trusted(row, metric) or not trusted(ref, metric):
        return "-"
    if not ref["metrics"][metric]:
        return "-"
    return ctx.ledger.derive("ratio", "ratio", [ctx.input(row, metric), ctx.input(ref, metric)])[1]


def headline(ctx: Context) -> list[Any]:
    groups = settings(ctx)
    if not groups:
        return empty_section("Headline", QUICK)
    ref = ctx.reference
    to = (
        f"`{ref}`'s module of the same mechanism (e.g. `{reference_backend(ref, 'lsh')}` for `lsh`)"
        if ref in families()
        else f"`{ref}`"
    )
    blocks: list[Any] = [
        Heading(1, "Headline"),
        Para(
            f"Per setting and length: the fastest and the leanest variant, then every variant's "
            f"median time (with its interquartile range) and peak memory, each also as a ratio to "
            f"{to} at the same setting and length (ratio = variant / reference; smaller is "
            f"better). {BUSY_MARK} marks a time measured while the machine was busy, "
            f"{UNSTABLE_MARK} one whose repeats disagreed."
        ),
    ]
    if aside := ctx.set_aside():
        blocks.append(Para(aside))
    for setting, part in groups:
        blocks.append(Heading(2, f"`{setting}`"))
        ok = part[part["status"] == "ok"]
        best_rows = []
        time_header, memory_header = header(TIME, "time"), header(MEMORY, "peak memory")
        for _, at_n in ok.groupby("seq_len", sort=True):
            timed = at_n[[trusted(r, TIME) for _, r in at_n.iterrows()]]
            sized = at_n[[MEMORY in m for m in at_n["metrics"]]]
            fast = (
                timed.loc[timed["metrics"].map(lambda m: m[TIME]).idxmin()] if len(timed) else None
            )
            lean = (
                sized.loc[sized["metrics"].map(lambda m: m[MEMORY]).idxmin()]
                if len(sized)
                else None
            )
            best_rows.append(
                [
                    ctx.config(at_n.iloc[0], "seq_len"),
                    f"`{fast['variant']}`" if fast is not None else "-",
                    ctx.metric(fast, TIME) if fast is not None else "-",
                    f"`{lean['variant']}`" if lean is not None else "-",
                    ctx.metric(lean, MEMORY) if lean is not None else "-",
                ]
            )
        if best_rows:
            blocks.append(Table(["L", "fastest", time_header, "leanest", memory_header], best_rows))
        if not any(len(_references(part, b, ref)) for b in part["backend"].unique()):
            blocks.append(Para(f"No `{ref}` case in this setting: no ratios."))
        rows = []
        extra = [m for m in extra_metrics() if any(m in x for x in part["metrics"])]
        for _, row in part.sort_values(["seq_len", "variant"]).iterrows():
            r = _reference_row(part, row["seq_len"], ref, row["backend"])
            rows.append(
                [
                    ctx.config(row, "seq_len"),
                    f"`{row['variant']}`",
                    ctx.metric(row, TIME, mark_time=True),
                    ctx.metric(row, "time_iqr", TIME),  # in the median's unit
                    _ratio(ctx, row, r, TIME),
                    ctx.metric(row, MEMORY),
                    _ratio(ctx, row, r, MEMORY),
                    *(ctx.metric(row, m) for m in extra),
                    f"`{row['note']}`" if row["note"] else "",
                ]
            )
        headers = [
            "L",
            "variant",
            header(TIME, "time"),
            header(TIME, "IQR"),
            f"time x {ref}",
            header(MEMORY, "peak memory"),
            f"memory x {ref}",
            *(header(m) for m in extra),
            "note",
        ]
        blocks.append(Table(headers, rows))
    return blocks


def scaling(ctx: Context) -> list[Any]:
    groups = settings(ctx)
    if not groups:
        return empty_section("Scaling", QUICK)
    blocks: list[Any] = [
        Heading(1, "Scaling"),
        Para(
            "Median time and peak memory against length, log-log (bars: the interquartile range "
            "of the time). The exponent is the slope of a least-squares line through the log-log "
            "points (time ∝ L^exponent); the crossover tables say from which length the row's "
            "variant is below the column's, interpolated log-log between the two measured lengths "
            "around the crossing — or that it is not within the measured range. Times set aside "
            "(busy or unstable) are plotted but never fitted or crossed."
        ),
    ]
    if aside := ctx.set_aside():
        blocks.append(Para(aside))
    for index, (setting, part) in enumerate(groups):
        blocks.append(Heading(2, f"`{setting}`"))
        ok = part[part["status"] == "ok"]
        path = scaling_plot(ok, setting, ctx.out_dir / f"scaling-{index + 1}.png")
        if path is not None:
            ctx.plots.append(path)
            blocks.append(Image(path, f"time and peak memory against length: {setting}"))
        fits = []
        for variant, vpart in ok.groupby("variant", sort=True):
            fits.append(
                [f"`{variant}`", _exponent(ctx, vpart, TIME), _exponent(ctx, vpart, MEMORY)]
            )
        blocks.append(Table(["variant", "time exponent", "memory exponent"], fits))
        for metric, name in ((TIME, "time"), (MEMORY, "peak memory")):
            table = _crossovers(ctx, ok, metric)
            if table is not None:
                blocks += [
                    Para(f"Crossovers in {name}: from which length the row beats the column."),
                    table,
                ]
    return blocks


def _exponent(ctx: Context, part: Any, metric: str) -> str:
    rows = [r for _, r in part.iterrows() if trusted(r, metric) and r["metrics"][metric] > 0]
    if len({r["seq_len"] for r in rows}) < 2:
        return "-"
    return ctx.ledger.derive("exponent", "exponent", [ctx.input(r, metric) for r in rows])[1]


def _crossovers(ctx: Context, ok: Any, metric: str) -> Table | None:
    from .analysis import crossover

    series = {
        v: {r["seq_len"]: r for _, r in p.iterrows() if trusted(r, metric)}
        for v, p in ok.groupby("variant", sort=True)
    }
    series = {v: s for v, s in series.items() if len(s) >= 2}
    if len(series) < 2:
        return None
    names = sorted(series)
    rows = []
    for a in names:
        cells = [f"`{a}`"]
        for b in names:
            if a == b:
                cells.append("")
                continue
            common = sorted(set(series[a]) & set(series[b]))
            found = crossover(
                common,
                [series[a][n]["metrics"][metric] for n in common],
                [series[b][n]["metrics"][metric] for n in common],
            )
            if found is None or len(common) < 2:
                cells.append("-")
            elif found.kind == "always":
                cells.append("at every measured length")
            elif found.kind == "never":
                cells.append("not within the measured range")
            else:
                inputs = [ctx.input(series[a][n], metric) for n in common] + [
                    ctx.input(series[b][n], metric) for n in common
                ]
                text = ctx.ledger.derive("length", "crossover", inputs, n_a=len(common))[1]
                cells.append(f"from L ≈ {text}")
        rows.append(cells)
    return Table(["variant \\ beats", *[f"`{b}`" for b in names]], rows)
