"""Headline and Scaling sections: time and peak memory per variant, ratios to the reference,
fitted power laws and crossover lengths. One table (and one plot) per setting: the parameters
that tell the setting apart are in its heading, the variant in each row."""

from __future__ import annotations

import math
from typing import Any

from ..measure.labels import (
    APPROX_CLASS,
    EXACT_CLASS,
    UNKNOWN_KIND,
    kind_class,
    kind_text,
    memory_metric,
    memory_word,
    ratio_header,
    status_text,
)
from ..measure.metrics import METRICS, reported
from ..measure.peers import families, reference_backend
from ..measure.status import OK
from ..measure.throughput import (
    OVER_PEAK,
    PEAK_UNKNOWN,
    RATE_HEADER,
    RATE_LABEL,
    SHARE_HEADER,
    SHARE_LABEL,
    case_throughput,
)
from .analysis import MIN_FIT_LENGTHS, crossover
from .context import (
    BUSY_MARK,
    TIME,
    UNSTABLE_MARK,
    Context,
    empty_section,
    opening,
    time_marks,
    trusted,
)
from .document import Heading, Image, Para, Table, narrow_tables
from .plots import caption, scaling_plot

QUICK = "zoo bench --preset quick"
MEMORY = "peak_bytes"
PEAK_PER_STEP = "peak per token"  # a decode case's transient peak, beside the state it keeps
DECODE_MEMORY_RULE = (
    "A decode setting's variants are ranked and divided by their decoding **state** (what "
    "decoding keeps between tokens); a token's transient peak is its own column, "
    f"**{PEAK_PER_STEP}**."
)


def header(metric: str, short: str = "") -> str:
    """A column header: the catalogue's bench-table column name (its label when it has none, or
    `short` for a derived quantity such as memory per layer) with its display unit, so `zoo
    bench`, `zoo results` and the report name a metric alike."""
    spec = METRICS[metric]
    name = short or spec.column or spec.label
    return name if spec.display_unit in ("ratio", name) else f"{name} [{spec.display_unit}]"


def column_legend() -> str:
    """What each metric column of the tables is (the catalogue's label), where its short name
    (the bench table's, shared with `zoo bench`) does not say it all."""
    specs = [METRICS[m] for m in (TIME, MEMORY, *extra_metrics())]
    return (
        "Columns: "
        + "; ".join(f"**{s.column}**: {s.label}" for s in specs if s.column and s.column != s.label)
        + "."
    )


def extra_metrics() -> list[str]:
    """The catalogue's reported metrics beyond time and peak memory (predicted memory, FLOPs)."""
    return [m.name for m in reported() if m.name not in (TIME, MEMORY)]


def has_rates(rows: Any) -> bool:
    """Whether any of these bench rows has a FLOP rate (a FLOP count and a median time)."""
    return any(case_throughput(r) is not None for _, r in rows.iterrows())


def rate_legend() -> str:
    return f"**{RATE_HEADER}**: {RATE_LABEL}; **{SHARE_HEADER}**: {SHARE_LABEL} ({OVER_PEAK})."


def rate_cells(ctx: Context, row: Any) -> list[str]:
    """A row's TFLOP/s and % peak cells (measure/throughput.py), through the ledger; the rate
    carries the marks of a time set aside."""
    found = case_throughput(row)
    if found is None:
        return ["-", "-"]
    inputs = [ctx.input(row, "flops"), ctx.input(row, TIME)]
    rate = ctx.ledger.derive("tflops", "ratio", inputs)[1] + time_marks(row)
    if found.peak is None:
        return [rate, PEAK_UNKNOWN]
    peak = {"peak_flops_per_s": found.peak.flops_per_s, "peak": found.peak.describe()}
    return [rate, ctx.ledger.derive("fraction", "peak_share", inputs, **peak)[1]]


def memory_of(part: Any) -> str:
    """The memory one setting's variants are ranked and divided by: a decode setting's decoding
    state, any other's peak (labels.memory_metric)."""
    return memory_metric(str(part["mode"].iloc[0])) if len(part) else MEMORY


def settings(ctx: Context) -> list[tuple[str, Any]]:
    if ctx.bench.empty:
        return []
    return list(ctx.bench.groupby("setting", sort=True))


def has_reference(part: Any, reference: str) -> bool:
    """Whether a setting's rows hold any case of `reference` (a variant label or peer family)."""
    return any(len(_references(part, b, reference)) for b in part["backend"].unique())


def _references(part: Any, backend: str, reference: str) -> Any:
    """The rows `backend`'s rows divide by: the variant labelled `reference`, or for a peer
    family ('hf') that family's peer of the same mechanism (lsh -> hf:lsh)."""
    if reference in families():
        return part[part["backend"] == (reference_backend(reference, backend) or "")]
    return part[part["label"] == reference]


def reference_row(part: Any, seq_len: int, reference: str, backend: str = "") -> Any:
    refs = _references(part, backend, reference)
    refs = refs[(refs["seq_len"] == seq_len) & (refs["status"] == "ok")]
    return None if refs.empty else refs.iloc[-1]


def ratio_cell(ctx: Context, row: Any, ref: Any, metric: str) -> str:
    if ref is None or not trusted(row, metric) or not trusted(ref, metric):
        return "-"
    if not ref["metrics"][metric]:
        return "-"
    return ctx.ledger.derive("ratio", "ratio", [ctx.input(row, metric), ctx.input(ref, metric)])[1]


def set_aside_rows(at_n: Any, metric: str, cls: str) -> list[Any]:
    """The rows of one setting and length in class `cls` (EXACT_CLASS or APPROX_CLASS) whose
    `metric` was measured but set aside (a busy or unstable time): any of them might be the
    smallest, so the class has no winner there."""
    return [
        r
        for _, r in at_n.iterrows()
        if r["computes"] != UNKNOWN_KIND
        and kind_class(r["computes"]) == cls
        and r["status"] == OK
        and metric in r["metrics"]
        and not trusted(r, metric)
    ]


def best(at_n: Any, metric: str) -> dict[str, Any]:
    """{EXACT_CLASS: row, APPROX_CLASS: row} of the rows of one setting and length: the smallest
    trusted `metric` in each class; None where the class has no trusted value, or where one of
    its values was set aside (set_aside_rows: the winner cannot be named)."""
    out: dict[str, Any] = {}
    for cls in (EXACT_CLASS, APPROX_CLASS):
        rows = [
            r
            for _, r in at_n.iterrows()
            if r["computes"] != UNKNOWN_KIND
            and kind_class(r["computes"]) == cls
            and trusted(r, metric)
        ]
        ranked = rows and not set_aside_rows(at_n, metric, cls)
        out[cls] = min(rows, key=lambda r: r["metrics"][metric]) if ranked else None
    return out


def tied(at_n: Any, winner: Any, metric: str) -> list[Any]:
    """The other rows of `winner`'s class that no ranking tells apart from it: a median time
    within the larger of the two interquartile ranges; an equal value of another metric."""
    if winner is None:
        return []
    cls, value = kind_class(winner["computes"]), winner["metrics"][metric]
    iqr = spread_of(metric)
    return [
        r
        for _, r in at_n.iterrows()
        if r["variant"] != winner["variant"]
        and r["computes"] != UNKNOWN_KIND
        and kind_class(r["computes"]) == cls
        and trusted(r, metric)
        and r["metrics"][metric] - value <= max(_spread(winner, iqr), _spread(r, iqr))
    ]


def spread_of(metric: str) -> str:
    """The metric holding `metric`'s spread: time_median's is time_iqr; one without a spread (a
    deterministic count) names a metric no row has, so its spread is 0."""
    return metric.removesuffix("_median") + "_iqr"


def _spread(row: Any, iqr: str) -> float:
    """A row's interquartile range of `iqr`, 0 where it has none (or NaN)."""
    value = row["metrics"].get(iqr)
    return 0.0 if value is None or value != value else float(value)


def tie_text(ties: list[Any]) -> str:
    """' (tied with `b`)' after a winner's cell, '' when it won outright."""
    if not ties:
        return ""
    return " (tied with " + ", ".join(f"`{r['variant']}`" for r in ties) + ")"


def note(row: Any) -> str:
    """A row's note: its status with the reason when it has no numbers, else its peer note."""
    if row["status"] != OK:
        return f"`{status_text(row['status'], row['error'])}`"
    text = "; ".join(t for t in (row["note"], row["error"]) if t)
    return f"`{text}`" if text else ""


def computes(row: Any) -> str:
    """The 'computes' cell: exact, exact pattern, recurrent or approximate (the backend's
    capabilities)."""
    return kind_text(row["computes"])


COMPUTES_RULE = (
    "**computes** says what a variant computes, from its backend's registered capabilities: "
    "`exact` (equals full softmax attention), `exact pattern` (exactly softmax attention under a "
    "fixed mask, e.g. a local window: not what full attention computes), `recurrent` (a "
    "recurrence over a constant-size state, checked against its token-by-token form) or "
    "`approximate`. Fastest and leanest are named per class: exact, and not exact (pattern, "
    "recurrent or approximate). "
    "The **kernel** is the implementation that ran (`zoo list` lists each backend's); "
    "`(captured)` after it: the CUDA step was timed as a CUDA graph's replay, without the "
    "time Python takes to launch its kernels; `(captured; ...)`: a replay that computes what "
    "it says apart from the plain step (a decode step over every slot of its cache, masked), "
    "timed as such."
)


def variant_cell(row: Any) -> str:
    """The variant with the kernel that ran (when stored) and what it computes, in one cell:
    `lsh` · cpu-fused · approximate."""
    parts = [f"`{row['variant']}`", row["kernel"], computes(row)]
    return " · ".join(p for p in parts if p and p != "-")


def time_cell(ctx: Context, row: Any) -> str:
    """The median time with its marks and its interquartile range in one cell, `median ± IQR`
    (a case without a time: its status)."""
    median = ctx.metric(row, TIME, mark_time=True)
    if TIME not in row["metrics"] or "time_iqr" not in row["metrics"]:
        return median
    return f"{median} ± {ctx.metric(row, 'time_iqr', TIME)}"  # the IQR in the median's unit


def with_unit(ctx: Context, row: Any, metric: str) -> str:
    """A stored value with its display unit, as the catalogue shows it."""
    return f"{ctx.metric(row, metric)} {METRICS[metric].display_unit}"


def named_value(ctx: Context, row: Any, metric: str) -> str:
    """A variant with its value and unit in one cell (the best-of-class tables)."""
    return f"`{row['variant']}` {with_unit(ctx, row, metric)}"


def _in_memory_table(metric: str) -> bool:
    """Whether an extra metric is memory (measured or predicted), shown with the peak."""
    return METRICS[metric].group in ("memory", "predict")


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
    blocks = opening(
        "Headline",
        (
            "Per setting and length: the fastest and the leanest variant of each class with its "
            "value, then a table for each question. **Time**: every variant (with the kernel that "
            "ran and what it computes: `variant` · kernel · computes) and its median time ± the "
            f"interquartile range, also as a ratio to {to} at the same setting and length (ratio "
            "= variant / reference; smaller is better). **Memory**: its peak memory, as a ratio "
            "too, beside the memory it keeps or was predicted to use. **Counted**, where "
            f"measured: its FLOPs and approx_error. {BUSY_MARK} marks a time measured while the "
            "machine was busy, "
            f"{UNSTABLE_MARK} one whose repeats disagreed. {COMPUTES_RULE} {column_legend()}"
            + (f" {rate_legend()}" if has_rates(ctx.bench) else "")
            + (f" {DECODE_MEMORY_RULE}" if any(memory_of(p) != MEMORY for _, p in groups) else "")
        ),
        ctx.set_aside(),
    )
    for setting, part in groups:
        blocks.append(Heading(2, f"`{setting}`"))
        if best_table := _best_table(ctx, part):
            blocks.append(best_table)
        if not has_reference(part, ref):
            blocks.append(Para(f"No `{ref}` case in this setting: no ratios."))
        blocks += _cost_tables(ctx, part)
    return blocks


def _best_table(ctx: Context, part: Any) -> Table | None:
    """Per length: the fastest and the leanest variant of each class, each with its value."""
    memory = memory_of(part)
    rows = []
    for _, at_n in part[part["status"] == OK].groupby("seq_len", sort=True):
        cells = [ctx.config(at_n.iloc[0], "seq_len")]
        for metric in (TIME, memory):
            found = best(at_n, metric)
            cells += [
                "-"
                if found[cls] is None
                else named_value(ctx, found[cls], metric) + tie_text(tied(at_n, found[cls], metric))
                for cls in (EXACT_CLASS, APPROX_CLASS)
            ]
        rows.append(cells)
    if not rows:
        return None
    kept = "" if memory == MEMORY else f" ({memory_word(memory)})"
    headers = [
        "L",
        f"fastest {EXACT_CLASS}",
        f"fastest {APPROX_CLASS}",
        f"leanest {EXACT_CLASS}{kept}",
        f"leanest {APPROX_CLASS}{kept}",
    ]
    return Table(headers, rows)


def _cost_tables(ctx: Context, part: Any) -> list[Table]:
    """One setting's variants in a time, a memory and (where measured) a counted table."""
    ref, memory = ctx.reference, memory_of(part)
    ordered = [row for _, row in part.sort_values(["seq_len", "variant"]).iterrows()]
    refs = [reference_row(part, row["seq_len"], ref, row["backend"]) for row in ordered]
    extra = [m for m in extra_metrics() if m != memory and any(m in x for x in part["metrics"])]
    kept = [MEMORY] if memory != MEMORY else []  # a decode setting's peak per token
    kept += [m for m in extra if _in_memory_table(m)]
    counted = [m for m in extra if not _in_memory_table(m)]
    rates = has_rates(part)
    spread = f"{METRICS[TIME].column} ± {METRICS['time_iqr'].column}"
    time_rows = [
        [
            ctx.config(row, "seq_len"),
            variant_cell(row),
            time_cell(ctx, row),
            ratio_cell(ctx, row, r, TIME),
            *(rate_cells(ctx, row) if rates else ()),
            note(row),
        ]
        for row, r in zip(ordered, refs)
    ]
    time_headers = [
        "L",
        "variant",
        header(TIME, spread),
        ratio_header("time", ref),
        *((RATE_HEADER, SHARE_HEADER) if rates else ()),
        "note",
    ]
    memory_rows = [
        [
            ctx.config(row, "seq_len"),
            f"`{row['variant']}`",
            ctx.metric(row, memory),
            ratio_cell(ctx, row, r, memory),
            *(ctx.metric(row, m) for m in kept),
        ]
        for row, r in zip(ordered, refs)
    ]
    memory_headers = [
        "L",
        "variant",
        header(memory),
        ratio_header(memory_word(memory), ref),
        *(header(m, PEAK_PER_STEP if m == MEMORY else "") for m in kept),
    ]
    tables = [
        Table(time_headers, time_rows, caption="**Time**"),
        Table(memory_headers, memory_rows, caption="**Memory**"),
    ]
    if counted:
        rows = [
            [
                ctx.config(row, "seq_len"),
                f"`{row['variant']}`",
                *(ctx.metric(row, m) for m in counted),
            ]
            for row in ordered
        ]
        headers = ["L", "variant", *(header(m) for m in counted)]
        tables.append(Table(headers, rows, caption="**Counted**"))
    return tables


NOT_ENOUGH = "not enough lengths"  # a fit or crossover with fewer than MIN_FIT_LENGTHS lengths


def scaling(ctx: Context) -> list[Any]:
    groups = settings(ctx)
    if not groups:
        return empty_section("Scaling", QUICK)
    blocks = opening(
        "Scaling",
        (
            "Median time and peak memory (a decode setting: its decoding state) against length, "
            "log-log (bars: the interquartile range "
            "of the time; solid lines exact variants, dashed ones not exact). The exponent is the "
            "slope of a least-squares line through the log-log points (time ∝ L^exponent), with "
            "its R² (1 = an exact power law); the crossover tables say from which length the "
            "row's variant is below the column's, interpolated log-log between the two measured "
            "lengths around the crossing — or that it is not within the measured range, or tied "
            "there (a time within the larger interquartile range is no win, as in every "
            "ranking). Both "
            f"need `{MIN_FIT_LENGTHS}` measured lengths or more; with fewer the cell says "
            f"{NOT_ENOUGH}. Times set aside (busy or unstable) are plotted but never fitted or "
            "crossed."
        ),
        ctx.set_aside(),
    )
    for index, (setting, part) in enumerate(groups):
        blocks.append(Heading(2, f"`{setting}`"))
        ok = part[part["status"] == OK]
        memory = memory_of(part)  # a decode setting's decoding state, else the peak
        word = "state" if memory != MEMORY else "memory"
        panels = {TIME: METRICS[TIME].column, memory: METRICS[memory].column}
        path = scaling_plot(ok, setting, ctx.out_dir / f"scaling-{index + 1}.png", panels)
        if path is not None:
            ctx.plots.append(path)
            what = "decoding state" if memory != MEMORY else "peak memory"
            blocks.append(Image(path, f"time and {what} against length: {setting}", caption(path)))
        fits = []
        for variant, vpart in ok.groupby("variant", sort=True):
            fits.append(
                [
                    f"`{variant}`",
                    computes(vpart.iloc[0]),
                    *_exponent(ctx, vpart, TIME),
                    *_exponent(ctx, vpart, memory),
                ]
            )
        blocks.append(
            Table(["variant", "computes", "time exponent", "R²", f"{word} exponent", "R²"], fits)
        )
        kept = "decoding state" if memory != MEMORY else "peak memory"
        for metric, name in ((TIME, "time"), (memory, kept)):
            if tables := _crossovers(ctx, ok, metric):
                blocks += [
                    Para(f"Crossovers in {name}: from which length the row beats the column."),
                    *tables,
                ]
    return blocks


def fit_inputs(ctx: Context, part: Any, metric: str) -> list[Any]:
    """The trusted positive values of one variant's rows: what an exponent is fitted through."""
    rows = [r for _, r in part.iterrows() if trusted(r, metric) and r["metrics"][metric] > 0]
    return [ctx.input(r, metric) for r in rows]


def _exponent(ctx: Context, part: Any, metric: str) -> tuple[str, str]:
    """(exponent, R²) cells; NOT_ENOUGH with fewer than MIN_FIT_LENGTHS lengths."""
    inputs = fit_inputs(ctx, part, metric)
    if len({c["seq_len"] for _, c, _ in inputs}) < MIN_FIT_LENGTHS:
        return NOT_ENOUGH, "-"
    exponent = ctx.ledger.derive("exponent", "exponent", inputs)[1]
    return exponent, ctx.ledger.derive("r2", "r2", inputs)[1]


def series(ok: Any, metric: str) -> dict[str, dict[int, Any]]:
    """variant -> {length: row} of its trusted values of `metric`."""
    return {
        v: {r["seq_len"]: r for _, r in p.iterrows() if trusted(r, metric)}
        for v, p in ok.groupby("variant", sort=True)
    }


def crossover_text(ctx: Context, a: dict[int, Any], b: dict[int, Any], metric: str) -> str:
    """From which length series `a` is below series `b` (through the largest common length),
    by the ranking's tie rule: within the larger interquartile range is no win (where every row
    has its spread: rows stored without one are compared by their medians alone)."""
    common = sorted(set(a) & set(b))
    if len(common) < MIN_FIT_LENGTHS:
        return NOT_ENOUGH
    rows = [a[n] for n in common] + [b[n] for n in common]
    spread = spread_of(metric)
    spreads = all(math.isfinite(r["metrics"].get(spread, math.nan)) for r in rows)
    measures = [metric, spread] if spreads else [metric]
    values = {m: [r["metrics"][m] for r in rows] for m in measures}
    n = len(common)
    margins = None
    if spreads:
        margins = [max(x, y) for x, y in zip(values[spread][:n], values[spread][n:])]
    found = crossover(common, values[metric][:n], values[metric][n:], margins)
    if found is None:
        return "-"
    if found.kind in CROSSOVER_WORDS:
        return CROSSOVER_WORDS[found.kind]
    inputs = [ctx.input(r, m) for m in measures for r in rows]
    params = {"n_a": n, "spread": True} if spreads else {"n_a": n}
    return "from L ≈ " + ctx.ledger.derive("length", "crossover", inputs, **params)[1]


CROSSOVER_WORDS = {
    "always": "at every measured length",
    "never": "not within the measured range",
    "tied": "tied at the longest length",
}


def _crossovers(ctx: Context, ok: Any, metric: str) -> list[Table]:
    found = {v: s for v, s in series(ok, metric).items() if len(s) >= MIN_FIT_LENGTHS}
    if len(found) < 2:
        return []
    names = sorted(found)
    rows = []
    for a in names:
        cells = [f"`{a}`"]
        for b in names:
            cells.append("" if a == b else crossover_text(ctx, found[a], found[b], metric))
        rows.append(cells)
    return narrow_tables(["variant \\ beats", *[f"`{b}`" for b in names]], rows)
