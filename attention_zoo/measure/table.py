"""Plain-text tables of measured cases with ratios to a reference backend; byte units in/out."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

from ..labels import variant_label

_UNITS = {
    "": 2**30,
    "b": 1,
    "k": 1e3,
    "kb": 1e3,
    "kib": 2**10,
    "m": 1e6,
    "mb": 1e6,
    "mib": 2**20,
    "g": 1e9,
    "gb": 1e9,
    "gib": 2**30,
    "t": 1e12,
    "tb": 1e12,
    "tib": 2**40,
}


def parse_bytes(text: str | float) -> int:
    """'8GB' -> 8e9, '8GiB' -> 8 * 2**30, '512MiB', '1.5G'; a bare number means GiB."""
    if isinstance(text, (int, float)):
        return int(text * 2**30)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read {text!r} as a size; write e.g. 8GiB, 8GB, 512MiB or 8 (GiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def format_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}" if unit == "GiB" else f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def format_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.2f} s"
    return f"{s * 1e3:.1f} ms" if s >= 1e-3 else f"{s * 1e6:.0f} us"


def format_table(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], *, right: Iterable[int] = ()
) -> str:
    """Columns padded to their widest cell; indices in `right` are right-aligned."""
    rows = [[str(c) for c in r] for r in rows]
    right = set(right)
    widths = (
        [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
        if rows
        else [len(h) for h in headers]
    )

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))
        ).rstrip()

    return "\n".join(
        [line(list(headers)), line(["-" * w for w in widths])] + [line(r) for r in rows]
    )


def group_cases(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Store rows (one per metric) -> one dict per case: config, status, error, metrics."""
    cases: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        key = (r["run_id"], r["case_key"])
        case = cases.get(key)
        if case is None:
            config = r["config"] if isinstance(r["config"], dict) else json.loads(r["config"])
            case = cases[key] = {
                "run_id": r["run_id"],
                "case_key": r["case_key"],
                "status": r["status"],
                "error": r["error"],
                "config": config,
                "metrics": {},
                "device_name": r.get("device_name"),
                "threads": r.get("threads"),
            }
        if r["metric"] is not None:
            case["metrics"][r["metric"]] = r["value"]
    return list(cases.values())


def _peer_key(config: dict[str, Any]) -> str:
    """What must match for two cases to be compared: everything but the mechanism."""
    return json.dumps(
        {k: v for k, v in config.items() if k not in ("backend", "options", "label")},
        sort_keys=True,
    )


# The columns that say which case a row is, in every table of cases.
CASE_HEADERS = ["target", "backend", "L", "batch", "mode", "dtype"]


def variant_name(config: dict[str, Any]) -> str:
    """A case's label (or backend) with its options: tells apart rows that share a label."""
    name = config.get("label") or config.get("backend", "?")
    return variant_label(name, config.get("options"))


def case_cells(config: dict[str, Any]) -> list[Any]:
    """The CASE_HEADERS cells of a case, from its config dict."""
    return [
        config.get("target", "?"),
        variant_name(config),
        *(config.get(k, "?") for k in ("seq_len", "batch", "mode", "dtype")),
    ]


def comparison_table(cases: Sequence[dict[str, Any]], reference: str | None = "full") -> str:
    """One line per case: time, measured and predicted memory, FLOPs, ratios to `reference`.

    The reference is the case with the same shape, mode, dtype and device whose backend is
    `reference` (no options); a ratio is '-' when that case is missing or did not run.
    """
    peers: dict[str, dict[str, Any]] = {}
    for c in cases:
        if (
            c["config"].get("backend") == reference
            and not c["config"].get("options")
            and c["status"] == "ok"
        ):
            peers.setdefault(_peer_key(c["config"]), c)
    headers = [
        *CASE_HEADERS,
        "status",
        "time (median)",
        "IQR",
        "peak (measured)",
        "predicted",
        "pred/meas",
        "GFLOP",
    ]
    if reference:
        headers += [f"time x {reference}", f"mem x {reference}"]
    table = []
    order = sorted(
        cases,
        key=lambda c: (
            c["config"].get("target", ""),
            c["config"].get("mode", ""),
            c["config"].get("dtype", ""),
            c["config"].get("seq_len", 0),
            c["config"].get("batch", 0),
        ),
    )
    for c in order:
        cfg, m = c["config"], c["metrics"]
        status = c["status"] if c["status"] == "ok" else c["status"].upper()
        meas, pred = m.get("peak_bytes"), m.get("predicted_peak_bytes")
        line = [
            *case_cells(cfg),
            status,
            format_seconds(m.get("time_median")),
            format_seconds(m.get("time_iqr")),
            format_bytes(meas),
            format_bytes(pred),
            f"{pred / meas:.2f}" if meas and pred is not None else "-",
            f"{m['flops'] / 1e9:.2f}" if m.get("flops") is not None else "-",
        ]
        if reference:
            ref = peers.get(_peer_key(cfg))
            rm = ref["metrics"] if ref else {}
            line += [
                _ratio(m.get("time_median"), rm.get("time_median")),
                _ratio(meas, rm.get("peak_bytes")),
            ]
        table.append(line)
    out = format_table(headers, table, right=range(2, len(headers)))
    notes: dict[tuple[str, str, str], list[str]] = {}
    for c in order:
        if c.get("error"):
            cfg = c["config"]
            where = f"L={cfg.get('seq_len')} {cfg.get('mode')}"
            notes.setdefault((variant_name(cfg), c["status"], c["error"]), []).append(where)
    if notes:
        out += "\n\nnot measured, failed, or with notes:\n" + "\n".join(
            f"  {what} ({len(cases_)} case{'s' if len(cases_) > 1 else ''}: {', '.join(cases_[:3])}"
            f"{', ...' if len(cases_) > 3 else ''}): {status}: {error}"
            for (what, status, error), cases_ in notes.items()
        )
    return out


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or not b:
        return "-"
    return f"{a / b:.2f}x"
