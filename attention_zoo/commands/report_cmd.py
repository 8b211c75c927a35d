"""`zoo report`: turn what the results store holds into report.html + report.md (with PNG plots)."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

from ..errors import UnavailableError, UsageError, did_you_mean
from ..install import install_hint
from ..measure.labels import DEFAULT_REFERENCE
from ..report import build_report
from ..report.browser import FIRST_SCREEN, chromium, screenshot
from ..report.fair import EQUAL
from ..report.frame import reference_choices
from ..report.index import check_index_target, write_index
from ..report.output import check_report_target
from ..report.rebuild import folder_inputs
from ..reproduce import REPRODUCTIONS
from ..store import DEFAULT_STORE, open_store
from .parsers import add_command, add_store_argument
from .recording import recorded_command
from .validate import check_output_file, check_output_folder

DEFAULT_OUT = "results/report"

HELP = "write an HTML + Markdown report from stored results"
DESCRIPTION = (
    "Build a comparison report (report.html, report.md, plots) from the results "
    "store: a summary, headline ratios, scaling and crossovers, accuracy x cost, Table 2, "
    "block variants, claims, cases without numbers, provenance. Only stored numbers (and "
    "numbers derived from them) appear; cases without one show their status."
)
EXAMPLE = """examples:
  zoo report                                  every configuration in results/zoo.sqlite (its
                                              latest run) -> results/report/
  zoo report --out reports/cpu-2core --index reports/README.md
                                              a published folder, and the index of all of them
  zoo report --run-id RUN --store my.sqlite   one run of another store
  zoo report --reference full                 ratios to full attention instead of sdpa
  zoo report --from reports/cpu-2core --screenshot
                                              rebuild a published folder from its own rows.csv
                                              and runs.json, with first-screen.png

Writes report.html (self-contained: plots embedded, no external URL; the summary first),
report.md with the same content and its PNG plots, summary.md (the summary alone: a pull-request
comment), rows.csv (the stored rows used), runs.json (their runs) and numbers.json (every printed
number with the stored rows it was computed from).
"""


DEFAULT_TITLE = "attention-zoo comparison"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "report", HELP, DESCRIPTION, EXAMPLE)
    add_store_argument(p, optional=True)
    p.add_argument(
        "--out",
        help=f"output folder, created if missing; its parent must exist (default: {DEFAULT_OUT})",
    )
    p.add_argument(
        "--from",
        dest="source",
        metavar="FOLDER",
        help="rebuild a folder zoo report wrote, from its rows.csv and runs.json instead of a "
        "store (--out defaults to FOLDER)",
    )
    p.add_argument(
        "--screenshot",
        action="store_true",
        help="also write first-screen.png: the report's first screen in headless Chromium",
    )
    p.add_argument(
        "--run-id",
        help="report only this run, or 'latest' (default: every run, the latest of each "
        "configuration)",
    )
    p.add_argument(
        "--reference",
        help="variant the report's ratios divide by, or a peer family (hf: each variant by "
        f"Hugging Face's module of the same mechanism) (default: {DEFAULT_REFERENCE})",
    )
    p.add_argument(
        "--title",
        help=f"report title (default: with --from, the folder's own; else {DEFAULT_TITLE!r})",
    )
    p.add_argument(
        "--equal",
        choices=sorted(EQUAL),
        help="compare only variants holding the reference's decoding state per sequence "
        "(state) or block parameters (params), within 10%%, at each setting and length",
    )
    p.add_argument(
        "--index",
        metavar="README",
        help="also regenerate this index of the report folders beside it (reports/README.md)",
    )
    p.set_defaults(run=run)


def _command(args: argparse.Namespace) -> str:
    """The command line that rebuilds this report (recorded in the folder and the index)."""
    if args.source:
        words = ["report", "--from", args.source]
        if Path(args.out) != Path(args.source):
            words += ["--out", args.out]
    else:
        words = ["report", "--store", args.store, "--out", args.out]
    if args.run_id:
        words += ["--run-id", args.run_id]
    if args.title is not None:
        words += ["--title", args.title]
    if args.reference is not None:
        words += ["--reference", args.reference]
    if args.equal:
        words += ["--equal", args.equal]
    if args.index:
        words += ["--index", args.index]
    if args.screenshot:
        words.append("--screenshot")
    for module in [*(args.imports or []), *(args.imports_sub or [])]:
        words += ["--import", module]
    return recorded_command(words)


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
    require_report_extra()
    if args.source and args.run_id:
        raise UsageError("--run-id selects from a store; --from rebuilds a whole folder: use one")
    if args.source and args.store:
        raise UsageError("--store reads a store; --from rebuilds a folder from its rows: use one")
    args.store = args.store or DEFAULT_STORE
    if args.screenshot and chromium() is None:
        raise UnavailableError(
            "--screenshot needs Chromium on PATH (Debian: apt-get install chromium)"
        )
    inputs = folder_inputs(args.source) if args.source else None  # says what --from lacks
    out = args.out or args.source or DEFAULT_OUT
    args.out = str(check_output_folder(out, "--out", default=args.out is None and not args.source))
    check_report_target(Path(args.out), f"--out {args.out}")
    if args.index:
        check_output_file(args.index, "--index")
        check_index_target(args.index, f"--index {args.index}")
    measured_by: list[str] = []
    if inputs is not None:
        df, runs, measured_by = inputs.rows, inputs.runs, inputs.measured_by
    else:
        df, runs = _from_store(args)
    if not len(df):
        raise UsageError(
            f"nothing stored in {args.source or args.store}; run 'zoo bench --preset quick' first"
        )
    reference = _reference(args, df, inputs.reference if inputs else None)
    files = build_report(
        df,
        args.out,
        runs=runs,
        reference=reference,
        title=args.title or (inputs.title if inputs else "") or DEFAULT_TITLE,
        command=_command(args),
        measured_by=measured_by,
        reproductions=list(REPRODUCTIONS),
        equal=args.equal,
    )
    print(f"report: {files.html}\n        {files.markdown}\nsummary: {files.summary}")
    print("".join(f"plot:   {p}\n" for p in files.plots) + f"rows:   {files.csv}")
    if args.screenshot:
        screenshot(files.html, Path(args.out) / FIRST_SCREEN)
        print(f"screen: {Path(args.out) / FIRST_SCREEN}")
    if args.index:
        print(f"index:  {write_index(args.index)}")
    return 0


def _reference(args: argparse.Namespace, df: Any, kept: str | None) -> str:
    """The variant the ratios divide by (--reference, else the one a --from folder kept, else the
    default): an explicit one must be among the rows (exit 2 otherwise); the default missing from
    them is said in one line (the report has no ratios)."""
    reference = args.reference or kept or DEFAULT_REFERENCE
    choices = reference_choices(df)
    if not choices or reference in choices:
        return reference
    where = args.source or args.store
    if args.reference is not None:
        raise UsageError(
            f"--reference {reference!r}: no measured variant of that name in {where}; "
            f"variants: {', '.join(choices)}" + did_you_mean(reference, choices)
        )
    print(
        f"zoo report: note: no {reference} case in {where}, so the report shows no ratios; "
        f"--reference picks the variant to divide by: {', '.join(choices)}",
        file=sys.stderr,
    )
    return reference


def _from_store(args: argparse.Namespace) -> tuple[Any, list[dict[str, Any]]]:
    with open_store(args.store, write=False) as store:
        if args.run_id == "latest":  # as zoo results names it; none yet: nothing stored
            args.run_id = store.latest_run()
        if args.run_id and store.run(args.run_id) is None:
            known = [r["run_id"] for r in store.runs()]
            raise UsageError(
                f"no run {args.run_id!r} in {args.store}; latest runs: "
                f"{', '.join(known[-5:]) or '(none)'}" + did_you_mean(args.run_id, known)
            )
        return store.to_dataframe(args.run_id), store.runs()
