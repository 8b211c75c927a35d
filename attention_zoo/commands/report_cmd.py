"""`zoo report`: turn what the results store holds into report.html + report.md (with PNG plots)."""

from __future__ import annotations

import argparse
import importlib
import sys

from ..errors import UnavailableError, UsageError, did_you_mean
from ..install import install_hint
from ..reproduce import REPRODUCTIONS
from ..store import DEFAULT_STORE, ResultStore
from .validate import check_output_file, check_output_folder

DEFAULT_OUT = "results/report"

EXAMPLE = """examples:
  zoo report                                  every configuration in results/zoo.sqlite (its
                                              latest run) -> results/report/
  zoo report --out reports/cpu-2core --index reports/README.md
                                              a published folder, and the index of all of them
  zoo report --run-id RUN --store my.sqlite   one run of another store
  zoo report --reference full                 ratios to full attention instead of sdpa

Writes report.html (self-contained: plots embedded, no external URL), report.md with the same
content and its PNG plots, rows.csv (the stored rows used) and numbers.json (every printed number
with the stored rows it was computed from).
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="write an HTML + Markdown report from stored results",
        description="Build a comparison report (report.html, report.md, plots) from the results "
        "store: headline ratios, scaling and crossovers, accuracy x cost, Table 2, block "
        "variants, claims, cases without numbers, provenance. Only stored numbers (and numbers "
        "derived from them) appear; cases without one show their status.",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--store", default=DEFAULT_STORE, help="SQLite results file (default: %(default)s)"
    )
    p.add_argument(
        "--out",
        help=f"output folder, created if missing; its parent must exist (default: {DEFAULT_OUT})",
    )
    p.add_argument(
        "--run-id",
        help="report only this run (default: every run, the latest of each configuration)",
    )
    p.add_argument(
        "--reference",
        default="sdpa",
        help="variant the headline's ratios divide by, or a peer family (hf: each variant by "
        "Hugging Face's module of the same mechanism) (default: %(default)s)",
    )
    p.add_argument("--title", default="attention-zoo comparison", help="report title")
    p.add_argument(
        "--index",
        metavar="README",
        help="also regenerate this index of the report folders beside it (reports/README.md)",
    )
    p.set_defaults(run=run)


def _command(args: argparse.Namespace) -> str:
    """The command line that rebuilds this report (recorded in the folder and the index)."""
    parts = ["zoo report", f"--store {args.store}", f"--out {args.out}"]
    if args.run_id:
        parts.append(f"--run-id {args.run_id}")
    if args.reference != "sdpa":
        parts.append(f"--reference {args.reference}")
    if args.index:
        parts.append(f"--index {args.index}")
    return " ".join(parts)


REPORT_MODULES = ("pandas", "seaborn", "matplotlib")  # what the report extra installs


def require_report_extra() -> None:
    """Fail in one line, before anything is read, when the report's packages are missing."""
    for name in REPORT_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            raise UnavailableError(
                f"zoo report needs the report extra ({name} is missing): {install_hint('report')}"
            ) from None


def run(args: argparse.Namespace) -> int:
    from ..report import build_report
    from ..report.index import write_index

    require_report_extra()
    args.out = str(check_output_folder(args.out or DEFAULT_OUT, "--out", default=args.out is None))
    if args.index:
        check_output_file(args.index, "--index")
    with ResultStore(args.store, create=False) as store:
        if args.run_id and store.run(args.run_id) is None:
            known = [r["run_id"] for r in store.runs()]
            raise UsageError(
                f"no run {args.run_id!r} in {args.store}; latest runs: "
                f"{', '.join(known[-5:]) or '(none)'}" + did_you_mean(args.run_id, known)
            )
        df = store.to_dataframe(args.run_id)
        runs = store.runs()
    if not len(df):
        print(
            f"zoo report: nothing stored in {args.store}; run 'zoo bench --preset quick' first",
            file=sys.stderr,
        )
        return 1
    files = build_report(
        df,
        args.out,
        runs=runs,
        reference=args.reference,
        title=args.title,
        command=_command(args),
        reproductions=list(REPRODUCTIONS),
    )
    print(f"report: {files.html}\n        {files.markdown}")
    print("".join(f"plot:   {p}\n" for p in files.plots) + f"rows:   {files.csv}")
    if args.index:
        print(f"index:  {write_index(args.index)}")
    return 0
