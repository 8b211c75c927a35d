"""Fidelity x cost section: each approximate variant's approx_error (against the dense reference,
per input family) beside its median time, per setting and length, with the Pareto front."""

from __future__ import annotations

from typing import Any

from ..measure.fidelity import NOT_MEASURED
from ..measure.metrics import FIDELITY_INPUTS, METRICS, approx_error_name
from .analysis import pareto_front
from .context import BUSY_MARK, UNSTABLE_MARK, Context, opening, trusted
from .cost import TIME, computes, header, settings
from .document import Heading, Image, Table
from .plots import caption, fidelity_plot

TITLE = "Fidelity x cost"
ERRORS = tuple(approx_error_name(inputs) for inputs in FIDELITY_INPUTS)
COMMAND = "zoo bench --backends full,local,lsh --lengths 1024,4096"


def fidelity_cost(ctx: Context) -> list[Any]:
    """The section; nothing when no bench case is stored, one line when none has approx_error."""
    if ctx.bench.empty:
        return []
    measured = ctx.bench[
        [
            s == "ok" and TIME in m and any(e in m for e in ERRORS)
            for s, m in zip(ctx.bench["status"], ctx.bench["metrics"])
        ]
    ]
    if measured.empty:
        reasons = sorted({f"`{_reason(e)}`" for e in ctx.bench["error"] if NOT_MEASURED in e})
        why = (
            "; ".join(reasons) if reasons else f"no approximate backend was measured (`{COMMAND}`)"
        )
        return opening(TITLE, f"approx_error not measured: {why}.")
    blocks = opening(
        TITLE,
        (
            "approx_error is the relative Frobenius error ||out - out_ref|| / ||out_ref|| of an "
            "approximate backend's attention core against the dense reference (`full`; "
            "`shared-qk` for shared-QK cores) on the same seeded q, k, v, at the case's shapes, "
            "causal flag and options. Two input families: `random` (Gaussian q, k, v: near-"
            "uniform attention, whose output is an average of many values and so small: "
            "relative errors above one are common) and `peaked` (each query matches the few "
            "keys of its group, scattered over the sequence: sharp attention). Per setting and "
            "length, **(front)** after an approx_error marks the Pareto front (no other variant "
            "both faster and more faithful on that input family). "
            f"{BUSY_MARK} marks a time measured while the machine was busy, "
            f"{UNSTABLE_MARK} one whose repeats disagreed: neither is on a front."
        ),
    )
    for index, (setting, part) in enumerate(settings(ctx)):
        part = part[part.index.isin(measured.index)]
        if part.empty:
            continue
        blocks.append(Heading(2, f"`{setting}`"))
        fronts = _fronts(part)
        path = fidelity_plot(
            _points(part), fronts, setting, ctx.out_dir / f"fidelity-{index + 1}.png"
        )
        ctx.plots.append(path)
        blocks.append(Image(path, f"approx_error against time: {setting}", caption(path)))
        rows = []
        for i, row in part.sort_values(["seq_len", "variant"]).iterrows():
            cells = [ctx.config(row, "seq_len"), f"`{row['variant']}`", computes(row)]
            cells.append(ctx.metric(row, TIME, mark_time=True))
            for error in ERRORS:
                on = " (front)" if fronts[error].get(i) else ""
                cells.append(ctx.metric(row, error) + on)
            rows.append(cells)
        headers = ["L", "variant", "computes", header(TIME)]
        headers += [f"approx_error ({inputs})" for inputs in FIDELITY_INPUTS]
        blocks.append(Table(headers, rows))
    return blocks


def _fronts(part: Any) -> dict[str, dict[Any, bool]]:
    """error metric -> {row index: on the Pareto front of its length (lower time and error)}."""
    fronts: dict[str, dict[Any, bool]] = {e: {} for e in ERRORS}
    for _, at_n in part.groupby("seq_len", sort=True):
        for error in ERRORS:
            # a time set aside (busy, unstable) is on no front
            have = at_n[[error in r["metrics"] and trusted(r, TIME) for _, r in at_n.iterrows()]]
            times = [m[TIME] for m in have["metrics"]]
            errors = [m[error] for m in have["metrics"]]
            on = pareto_front(times, errors, maximize=False)
            fronts[error].update(zip(have.index, on))
    return fronts


def _points(part: Any) -> Any:
    """One row per (case, input family) with a stored error: the plot's data."""
    import pandas as pd

    time_scale = METRICS[TIME].scale
    records = [
        {
            "index": i,
            "variant": r["variant"],
            "L": r["seq_len"],
            "inputs": inputs,
            "metric": error,
            "time": r["metrics"][TIME] / time_scale,
            "approx_error": r["metrics"][error],
        }
        for i, r in part.iterrows()
        for inputs, error in zip(FIDELITY_INPUTS, ERRORS)
        if error in r["metrics"]
    ]
    return pd.DataFrame(records)


def _reason(error: str) -> str:
    """The reason in a case's approx_error note ('a; approx_error not measured: b' -> 'b')."""
    return (
        next(p for p in error.split("; ") if NOT_MEASURED in p)
        .strip()
        .removeprefix(NOT_MEASURED + ": ")
    )
