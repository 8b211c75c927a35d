"""Plain-text tables: one renderer (format_table) and the table of measured cases with ratios to a
reference backend."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from .cases import comparison_key
from .labels import (
    DEFAULT_REFERENCE,
    KERNEL_HEADER,
    PEAK,
    case_kind,
    case_label,
    facts_of,
    kernel_text,
    kind_text,
    memory_metric,
    memory_word,
    ratio_header,
    resolve_options,
    status_text,
)
from .metrics import table_columns
from .peers import peer_note, reference_backend
from .status import OK
from .throughput import (
    RATE_HEADER,
    SHARE_HEADER,
    case_throughput,
    rate_cell,
    rate_notes,
    share_cell,
)
from .trust import CPU_TIME_NOTE, CPU_TIMED, MARK_RULES, time_trusted, timing_marks


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
                "git_commit": r.get("git_commit"),
                "torch_version": r.get("torch_version"),
                "created_at": r.get("created_at"),
                "environment": r.get("environment"),  # JSON text: where it was measured
                "facts": facts_of(r.get("facts")),
            }
        if r["metric"] is not None:
            case["metrics"][r["metric"]] = r["value"]
    return list(cases.values())


# The columns that say which case a row is, in every table of cases.
CASE_HEADERS = ["target", "backend", "L", "batch", "mode", "dtype"]


def case_cells(config: dict[str, Any]) -> list[Any]:
    """The CASE_HEADERS cells of a case, from its config dict."""
    return [
        config.get("target", "?"),
        case_label(config),
        *(config.get(k, "?") for k in ("seq_len", "batch", "mode", "dtype")),
    ]


def comparison_table(
    cases: Sequence[dict[str, Any]], reference: str | None = DEFAULT_REFERENCE
) -> str:
    """One line per case: what it computes, time, measured and predicted memory, FLOPs, the FLOP
    rate and its share of the device's peak (measure/throughput.py), ratios to `reference` (the
    report's words: measure/labels.py).

    The reference is the case with the same shape, mode, dtype and device whose backend is
    `reference` (the one without options, if several); a peer family as reference ('hf') means
    its peer of each case's mechanism (lsh -> hf:lsh). A ratio is '-' when that case is missing
    or did not run.
    """
    refs: dict[tuple[Any, str, str], dict[str, Any]] = {}  # (run, backend, comparison)

    def has_options(c: dict[str, Any]) -> bool:
        return bool(resolve_options(c["config"].get("backend", ""), c["config"].get("options")))

    for c in sorted(cases, key=has_options):
        if c["status"] == OK:
            key = (c.get("run_id"), c["config"].get("backend", ""), comparison_key(c["config"]))
            refs.setdefault(key, c)  # a case is compared within its own run
    columns = table_columns()
    varying = _varying(cases)
    headers = [*CASE_HEADERS, *varying, "computes", KERNEL_HEADER, "status"]
    headers += [m.column for m in columns]
    headers += [RATE_HEADER, SHARE_HEADER, "pred/meas"]
    # memory ratios by what each case is compared by: peak, or a decode case's state (both kinds
    # in one table: a column each)
    compared = sorted({memory_metric(c["config"].get("mode", "")) for c in cases}) or [PEAK]
    if reference:
        headers += [ratio_header("time", reference)]
        headers += [ratio_header(memory_word(metric), reference) for metric in compared]
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
    kinds = {id(c): [mark.kind for mark in _marks(c)] for c in cases}
    referenced = False  # whether any case found its reference
    for c in order:
        cfg, m = c["config"], c["metrics"]
        status = status_text(c["status"])  # the reason follows the table, in its notes
        if c["status"] == OK:  # a time set aside says why in the notes
            status += "".join(f" ({kind})" for kind in kinds[id(c)])
        meas, pred = m.get("peak_bytes"), m.get("predicted_peak_bytes")
        rate = case_throughput(c)
        line = [
            *case_cells(cfg),
            *(c["threads"] if k == "threads" else cfg.get(k, "?") for k in varying),
            kind_text(case_kind(cfg, c.get("facts"))),
            kernel_text(c.get("facts")),
            status,
            *(spec.fmt(m.get(spec.name)) for spec in columns),
            rate_cell(rate),
            share_cell(rate),
            f"{pred / meas:.2f}" if meas and pred is not None else "-",
        ]
        if reference:
            wanted = reference_backend(reference, cfg.get("backend", ""))
            ref = refs.get((c.get("run_id"), wanted or "", comparison_key(cfg)))
            referenced = referenced or ref is not None
            rm = ref["metrics"] if ref else {}
            both_trusted = ref is not None and all(
                time_trusted(x["status"], kinds[id(x)]) for x in (c, ref)
            )
            mine = memory_metric(cfg.get("mode", ""))
            line += [_ratio(m.get("time_median"), rm.get("time_median")) if both_trusted else "-"]
            line += [
                _ratio(m.get(metric), rm.get(metric)) if metric == mine else "-"
                for metric in compared
            ]
        table.append(line)
    out = format_table(headers, table, right=range(2, len(headers)))
    if rates := rate_notes(order):
        out += "\n\n" + "\n".join(rates)
    if any(c["metrics"].get(CPU_TIMED) for c in cases):
        out += f"\n\n{CPU_TIME_NOTE}"
    if reference and cases and not referenced:
        backends = sorted({str(c["config"].get("backend", "?")) for c in cases})
        out += (
            f"\n\nno ratios: no {reference} case ran among these (backends: "
            f"{', '.join(backends)}); --reference picks one of them"
        )
    notes: dict[tuple[str, str, str], list[str]] = {}
    for c in order:
        if c.get("error"):
            cfg = c["config"]
            notes.setdefault((case_label(cfg), c["status"], c["error"]), []).append(_where(cfg))
    if notes:
        out += "\n\nnot measured, failed, or with notes:\n" + "\n".join(
            f"  {what} ({_some(cases_)}): {status}: {error}"
            for (what, status, error), cases_ in notes.items()
        )
    marked: dict[str, list[str]] = {}
    for c in order:
        for kind in kinds[id(c)] if c["status"] == OK else ():
            marked.setdefault(kind, []).append(_where(c["config"], with_label=True))
    if marked:
        out += "\n\ntimes set aside (never in a time ratio):\n" + "\n".join(
            f"  {kind} ({_some(where)}): {MARK_RULES[kind]}" for kind, where in marked.items()
        )
        out += "\n  each case's numbers (time_iqr, time_min, free_cores): zoo results --format csv"
    peers = {case_label(c["config"]): c["config"] for c in order if c["config"].get("peer")}
    if peers:
        out += "\n\npeers (other libraries, measured by the same harness):\n" + "\n".join(
            f"  {name} [{cfg['peer']}]: {peer_note(cfg)}" for name, cfg in peers.items()
        )
    return out


def _marks(case: dict[str, Any]) -> list[Any]:
    """A stored case's timing marks (trust.timing_marks), from its rows and stored threads."""
    threads = int(case["threads"]) if case.get("threads") else 1
    device = case["config"].get("device", "cpu")
    return timing_marks(case["metrics"], threads=threads, device=device)


def _where(config: dict[str, Any], *, with_label: bool = False) -> str:
    where = f"L={config.get('seq_len')} {config.get('mode')}"
    return f"{case_label(config)} {where}" if with_label else where


def _some(cases: list[str]) -> str:
    """'N case(s): the first three, ...'."""
    more = ", ..." if len(cases) > 3 else ""
    return f"{len(cases)} case{'s' if len(cases) > 1 else ''}: {', '.join(cases[:3])}{more}"


# Case parameters beyond CASE_HEADERS; a table shows those that differ between its cases.
OTHER_PARAMETERS = ("causal", "num_heads", "head_dim", "hidden", "device", "threads")


def _varying(cases: Sequence[dict[str, Any]]) -> list[str]:
    def value(c: dict[str, Any], k: str) -> Any:
        return c.get("threads") if k == "threads" else c["config"].get(k)

    return [k for k in OTHER_PARAMETERS if len({str(value(c, k)) for c in cases}) > 1]


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or not b:
        return "-"
    ratio = a / b
    return f"{ratio:.2f}x" if ratio >= 0.1 else f"{ratio:.2g}x"  # 0.0020x, not 0.00x
