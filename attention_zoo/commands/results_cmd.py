"""`zoo results`: show or export what the results store holds."""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import ZooError
from ..measure.table import comparison_table, format_table, group_cases
from ..store import DEFAULT_STORE, ResultStore

EXAMPLE = """examples:
  zoo results                              the latest run as a comparison table
  zoo results --runs                       every run: id, kind, commit, device, threads, cases
  zoo results --run all --format csv -o all.csv
                                           every row of every run as CSV (one row per metric)
  zoo results --run 20250101-120000-ab12cd --format json --metric peak_bytes

Each row carries run id, git commit, torch version, device name, threads and the case config
(JSON). In Python: ResultStore(path).to_dataframe() gives the same rows as a pandas DataFrame.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "results",
        help="show or export stored results (table, CSV, JSON)",
        description="Show or export the results store: a comparison table, or rows as CSV/JSON.",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--store", default=DEFAULT_STORE, help="SQLite results file (default: %(default)s)"
    )
    p.add_argument(
        "--run", dest="run_id", default="latest", help="run id, 'latest' (default) or 'all'"
    )
    p.add_argument("--runs", action="store_true", help="list the runs instead of their results")
    p.add_argument(
        "--format", choices=["table", "csv", "json"], default="table", help="output format"
    )
    p.add_argument("--metric", help="only rows of this metric (csv/json)")
    p.add_argument(
        "--reference", default="full", help="backend the table's ratios divide by (default: full)"
    )
    p.add_argument("-o", "--output", help="write to this file instead of stdout")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        store = ResultStore(args.store, create=False)
    except ZooError as err:
        print(f"zoo results: {err}", file=sys.stderr)
        return 2
    with store:
        if args.runs:
            text = _runs_table(store)
        else:
            wanted = args.run_id
            run_id = (
                None if wanted == "all" else store.latest_run() if wanted == "latest" else wanted
            )
            if wanted == "latest" and run_id is None:
                print(
                    f"zoo results: {args.store} holds no runs yet; run 'zoo bench --preset quick'",
                    file=sys.stderr,
                )
                return 1
            if run_id is not None and store.run(run_id) is None:
                known = ", ".join(r["run_id"] for r in store.runs()[-5:]) or "(none)"
                print(
                    f"zoo results: no run {run_id!r} in {args.store}; latest runs: {known}",
                    file=sys.stderr,
                )
                return 2
            text = _render(store, run_id, args)
    if args.output:
        with open(args.output, "w", newline="") as f:
            f.write(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


def _render(store: ResultStore, run_id: str | None, args: argparse.Namespace) -> str:
    rows = store.rows(run_id, metric=args.metric)
    if args.format == "csv":
        import csv
        import io

        from ..store import EXPORT_COLUMNS

        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(EXPORT_COLUMNS))
        writer.writeheader()
        writer.writerows(rows)
        return buf.getvalue()
    if args.format == "json":
        return json.dumps([{**r, "config": json.loads(r["config"])} for r in rows], indent=2)
    cases = group_cases(rows)
    if all("seq_len" in c["config"] and "backend" in c["config"] for c in cases):
        return comparison_table(cases, reference=args.reference)
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
        ["run", "kind", "git commit", "torch", "device", "threads", "cases", "finished"],
        [
            [
                r["run_id"],
                r["kind"],
                r["git_commit"][:12],
                r["torch_version"],
                r["device_name"][:32],
                r["threads"],
                r["n_cases"],
                "yes" if r["finished_at"] else "no",
            ]
            for r in runs
        ],
    )
