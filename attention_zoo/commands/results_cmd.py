"""`zoo results`: show or export what the results store holds."""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

from ..errors import UsageError, did_you_mean
from ..measure.labels import DEFAULT_REFERENCE
from ..measure.table import comparison_table, format_table, group_cases
from ..measure.throughput import DERIVED, FLOP_RATE, PEAK_SHARE, derived_rows
from ..recover import recover
from ..report.output import write_text_atomic
from ..store import ResultStore, open_store, run_status, write_csv
from .parsers import add_command, add_store_argument
from .validate import DeprecatedAlias, check_output_file, check_reference, reject_together

HELP = "show or export stored results (table, CSV, JSON)"
DESCRIPTION = "Show or export the results store: a comparison table, or rows as CSV/JSON."
EXAMPLE = f"""examples:
  zoo results                              the latest run as a comparison table
  zoo results --runs                       every run: id, kind, version, commit, device, threads
  zoo results --format csv -o all.csv      every row of every run as CSV (one row per metric)
  zoo results --run-id latest --format csv only the latest run
  zoo results --run-id 20250101-120000-ab12cd --format json --metric peak_bytes
  zoo results --store zoo.sqlite --recover  a damaged store's readable rows -> zoo.recovered.sqlite

Each row carries run id, git commit, torch version, device name, threads and the case config
(JSON). In Python: ResultStore(path).to_dataframe() gives the same rows as a pandas DataFrame.
csv/json also hold, per case with a FLOP count and a median time, a {FLOP_RATE} row (flop/s: the
counted FLOPs of one step / its median time) and, where the device's dense peak for the dtype is
known, a {PEAK_SHARE} row (its share of that peak, named in the unit): derived as they are read,
never stored.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "results", HELP, DESCRIPTION, EXAMPLE)
    add_store_argument(p)
    p.add_argument(
        "--run-id",
        help="a run id, 'latest' or 'all' (default: the latest run for the table, every run "
        "for csv/json)",
    )
    p.add_argument("--run", dest="run_id", action=DeprecatedAlias, new="--run-id")
    p.add_argument("--runs", action="store_true", help="list the runs instead of their results")
    p.add_argument(
        "--format", choices=["table", "csv", "json"], default="table", help="output format"
    )
    p.add_argument("--metric", help="only rows of this metric (csv/json)")
    p.add_argument(
        "--reference", help=f"backend the table's ratios divide by (default: {DEFAULT_REFERENCE})"
    )
    p.add_argument(
        "-o", "--output", help="write to this file instead of stdout (an existing file is replaced)"
    )
    p.add_argument(
        "--recover",
        nargs="?",
        const="",
        metavar="NEW_STORE",
        help="copy the rows a damaged store can still be read for into a new store (default: "
        "STORE.recovered.sqlite beside it); the damaged file is only read",
    )
    p.set_defaults(run=run)


def check_flags(args: argparse.Namespace) -> None:
    """Flags that conflict or would do nothing, refused before the store is opened."""
    for flag in ("runs", "run_id", "metric", "reference", "output"):
        reject_together(args, "recover", flag, "--recover copies every readable row")
    for flag in ("run_id", "metric", "reference"):
        reject_together(args, "runs", flag, "--runs lists every run as a table")
    if args.runs and args.format != "table":
        raise UsageError("--runs lists the runs as a table; --format applies to result rows")
    if args.metric is not None and args.format == "table":
        raise UsageError(
            "--metric selects rows for csv/json; the table shows every metric "
            "(add --format csv or --format json)"
        )
    if args.reference is not None and args.format != "table":
        raise UsageError("--reference sets the table's ratios; csv/json rows have none")
    if args.output is not None:
        check_output_file(args.output, "--output")


def run(args: argparse.Namespace) -> int:
    check_flags(args)
    if args.recover is not None:
        return _recover(Path(args.store), args.recover)
    with open_store(args.store, write=False) as store:
        if args.runs:
            text = _runs_table(store)
        else:
            wanted = args.run_id or ("latest" if args.format == "table" else "all")
            run_id = (
                None if wanted == "all" else store.latest_run() if wanted == "latest" else wanted
            )
            if wanted == "latest" and run_id is None:
                raise UsageError(f"{args.store} holds no runs yet; run 'zoo bench --preset quick'")
            if run_id is not None and store.run(run_id) is None:
                known = ", ".join(r["run_id"] for r in store.runs()[-5:]) or "(none)"
                raise UsageError(
                    f"no run {run_id!r} in {args.store}; latest runs: {known}"
                    + did_you_mean(run_id, [r["run_id"] for r in store.runs()])
                )
            known = store.metric_names(run_id)
            if {"flops", "time_median"} <= set(known):
                known += DERIVED
            if args.metric is not None and args.metric not in known:
                raise UsageError(
                    f"no metric {args.metric!r} stored"
                    + (f" in run {run_id}" if run_id else "")
                    + f"; metrics: {', '.join(known) or '(none)'}"
                    + did_you_mean(args.metric, known)
                )
            text = _render(store, run_id, args)
    if args.output:
        out = Path(args.output)
        replaced = out.is_file() and out.stat().st_size > 0
        write_text_atomic(out, text)  # all of it, or the file as it was
        print(
            f"wrote {args.output}" + (" (replacing what it held)" if replaced else ""),
            file=sys.stderr,
        )
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


def _recover(store: Path, dest: str) -> int:
    target = Path(dest) if dest else store.with_name(f"{store.stem}.recovered.sqlite")
    got = recover(store, target)
    rows = ", ".join(f"{table} {n}" for table, n in got.rows.items())
    lost = (
        f"; {got.without_case} result rows lost their case row (kept, not shown)"
        if got.without_case
        else ""
    )
    if got.cut_short:
        lost += "; reading stopped at its budget of SQLite steps: rows further on were not read"
    print(f"recovered into {target} the rows that could be read ({rows}){lost}; {store} unchanged")
    return 0


def _export_rows(store: ResultStore, run_id: str | None, metric: str | None) -> list[dict]:
    """The stored rows (of `metric`), then the rows derived from them (measure/throughput.py)."""
    if metric in DERIVED:
        return [r for r in derived_rows(store.rows(run_id)) if r["metric"] == metric]
    rows = store.rows(run_id, metric=metric)
    return rows if metric else rows + derived_rows(rows)


def _render(store: ResultStore, run_id: str | None, args: argparse.Namespace) -> str:
    if args.format != "table":
        rows = _export_rows(store, run_id, args.metric)
    else:
        rows = store.rows(run_id)
    if args.format == "csv":
        buf = io.StringIO()
        write_csv(buf, rows)
        return buf.getvalue()
    if args.format == "json":
        return json.dumps([{**r, "config": json.loads(r["config"])} for r in rows], indent=2)
    cases = group_cases(rows)
    if all("seq_len" in c["config"] and "backend" in c["config"] for c in cases):
        check_reference(args.reference, [c["config"]["backend"] for c in cases], "pick one")
        return comparison_table(cases, reference=args.reference or DEFAULT_REFERENCE)
    # Rows from other writers (e.g. tasks): one line per metric.
    return format_table(
        ["run", "case", "status", "metric", "value", "unit", "config"],
        [
            [
                r["run_id"],
                r["case_key"],
                r["status"],
                r["metric"] or "-",
                _num(r["value"]),
                r["unit"] or "",
                r["config"][:60],
            ]
            for r in rows
        ],
        right=[4],
    )


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.6g}"


def _runs_table(store: ResultStore) -> str:
    runs = store.runs()
    return format_table(
        ["run", "kind", "version", "git commit", "torch", "device", "threads", "cases", "status"],
        [
            [
                r["run_id"],
                r["kind"],
                r["meta"].get("zoo_version", "-"),
                r["git_commit"][:12],
                r["torch_version"],
                r["device_name"][:32],
                r["threads"],
                r["n_cases"],
                run_status(r),
            ]
            for r in runs
        ],
    )
