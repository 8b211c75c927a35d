"""`zoo report`: turn what the results store holds into Markdown tables and PNG plots."""

from __future__ import annotations

import argparse

from ..store import ResultStore

DEFAULT_STORE = "results/zoo.sqlite"

EXAMPLE = """examples:
  zoo report                                 latest bench run of results/zoo.sqlite
                                             -> results/report/
  zoo report --all --out reports/cpu-2core   every stored run, into a published folder
  zoo report --run-id RUN --store my.sqlite  one run of another store
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="write a Markdown + PNG report from stored results",
        description="Build a comparison report (report.md, time and memory plots) from the results "
        "store. Only stored numbers appear; cases without one show their status.",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--store", default=DEFAULT_STORE, help="SQLite results file (default: %(default)s)"
    )
    p.add_argument("--out", default="results/report", help="output folder (default: %(default)s)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--run-id", help="report this run (default: the latest bench run)")
    which.add_argument("--all", action="store_true", help="report every run in the store")
    p.add_argument("--title", default="attention-zoo comparison", help="report title")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..report import build_report

    with ResultStore(args.store, create=False) as store:
        run_id = None if args.all else (args.run_id or store.latest_run(kind="bench"))
        if not args.all and run_id is None:
            print(
                f"no bench run in {args.store}; run 'zoo bench --preset quick' first, or pass --all"
            )
            return 1
        df = store.to_dataframe(run_id)
    if not len(df):
        print(f"nothing stored for run {run_id!r} in {args.store}")
        return 1
    files = build_report(df, args.out, title=args.title)
    print(f"report: {files.markdown}" + "".join(f"\nplot:   {p}" for p in files.plots))
    return 0
