"""Build the report: stored rows -> report.md + report.html (same blocks; the summary first),
summary.md (that section alone), PNG plots, the CSV of the rows used, runs.json (the runs they
belong to: with rows.csv, what rebuilds the folder) and numbers.json (every printed number with
its source).

Only stored numbers appear, or numbers derived from them by a named formula (listed in
numbers.json with their inputs); a case without numbers says why.
"""

from __future__ import annotations

import json
import logging
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..measure.labels import DEFAULT_REFERENCE, facts_of
from ..paths import portable_command, portable_words
from . import accuracy, cost, decoding, fair, fidelity, misc, summary, variants
from .browser import FIRST_SCREEN
from .claims import ClaimsSource, claims_section
from .context import Context
from .document import Document, Image, Para, to_html, to_markdown
from .frame import bench_frame, case_frame, latest_per_identity, task_frame
from .output import GENERATOR, META_FILE, staged_folder, writing
from .plots import CAPTIONS, caption

log = logging.getLogger(__name__)

DEFAULT_TITLE = "attention-zoo comparison"
# Written when there is data, each kind with its caption (plots.CAPTIONS; the reproductions' own
# sections name theirs too): a plot the new build does not write is never carried over.
PLOT_PATTERNS = (*(f"{prefix}*.png" for prefix in CAPTIONS), FIRST_SCREEN)


Section = Callable[[Context], list[Any]]  # the blocks of one section of the report


def _claims(ctx: Context) -> list[Any]:
    return claims_section(ctx, ctx.rows, ctx.reproductions)


def _reproduction_sections(ctx: Context) -> list[Any]:
    return [block for r in ctx.reproductions for block in r.report_sections(ctx)]


# The report's sections after the summary, in order. A new section is a function of the Context
# in a module of this package and its entry here (a plot of a new kind: its caption in
# plots.CAPTIONS).
SECTIONS: tuple[Section, ...] = (
    cost.headline,
    cost.scaling,
    decoding.section,
    fair.section,
    fidelity.fidelity_cost,
    accuracy.accuracy_cost,
    accuracy.task_tables,
    variants.block_variants,
    _claims,
    _reproduction_sections,
    misc.missing,
    misc.provenance,
)


@dataclass
class ReportFiles:
    """What build_report wrote."""

    markdown: Path
    html: Path
    summary: Path
    csv: Path
    runs: Path
    numbers: Path
    plots: list[Path] = field(default_factory=list)


def select(df: Any, runs: list[dict[str, Any]] | None) -> Context:
    """Apply the selection rule (frame.SELECTION_RULE) to stored rows; the sections' input."""
    cases = case_frame(df, runs)
    bench = bench_frame(cases)
    earlier: dict[str, int] = {}
    if not bench.empty:
        bench, earlier = latest_per_identity(bench)
    tasks = task_frame(cases)
    if not cases.empty:
        # the rows the sections print from, and the latest row of each case without an ok run
        shown = {
            (r, c, "bench") for r, c in zip(bench.get("run_id", ()), bench.get("case_key", ()))
        }
        shown |= {
            (r, c, "task") for r, c in zip(tasks.get("run_id", ()), tasks.get("case_key", ()))
        }
        with_numbers = {(c, k) for _, c, k in shown}
        others = cases[cases["kind"] != "bench"]
        others, _ = latest_per_identity(others.assign(identity=others["case_key"]))
        shown |= {
            (r, c, k)
            for r, c, k in zip(others["run_id"], others["case_key"], others["kind"])
            if (c, k) not in with_numbers
        }
        keep = [t in shown for t in zip(cases["run_id"], cases["case_key"], cases["kind"])]
        cases = cases[keep]
    return Context(
        cases=cases,
        bench=bench,
        tasks=tasks,
        runs=list(runs or []),
        out_dir=Path("."),
        earlier_runs=earlier,
    )


def build_report(
    df: Any,
    out_dir: str | Path,
    *,
    runs: list[dict[str, Any]] | None = None,
    reference: str = DEFAULT_REFERENCE,
    title: str = DEFAULT_TITLE,
    command: str = "",
    measured_by: list[str] | None = None,
    reproductions: Sequence[ClaimsSource] = (),
    equal: str | None = None,
) -> ReportFiles:
    """Write the report of ResultStore rows (`to_dataframe()` or `rows()`) into out_dir.

    runs: ResultStore.runs() (load at start and end, for the busy marks and provenance).
    measured_by: the measuring commands to record when the runs' metadata names none (a folder
    rebuilt from its own rows: report.rebuild).
    reproductions: whose claims and own tables to add (`zoo report`: every registered one).
    equal: "state" or "params": only the variants holding the reference's (report.fair).
    The folder is built beside out_dir and swapped in whole (report.output): a write that fails
    leaves the previous report as it was."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    plots = (*PLOT_PATTERNS, *(p for r in reproductions for p in r.plots))
    with staged_folder(out_dir, regenerated=plots) as stage:
        files = _write_report(
            df, stage, runs, reference, title, command, measured_by or [], reproductions, equal
        )
    log.info("report written to %s", out_dir / files.markdown.name)
    return ReportFiles(
        **{k: out_dir / v.name for k, v in vars(files).items() if k != "plots"},
        plots=[out_dir / p.name for p in files.plots],
    )


def _write_report(
    df: Any,
    out_dir: Path,
    runs: list[dict[str, Any]] | None,
    reference: str,
    title: str,
    command: str,
    measured_by: list[str],
    reproductions: Sequence[ClaimsSource],
    equal: str | None = None,
) -> ReportFiles:
    ctx = select(df, runs)
    ctx.out_dir, ctx.reference = out_dir, reference
    if equal is not None:
        kept = fair.hold_equal(ctx.bench, reference, equal)
        ctx.held_equal = fair.held_equal_text(ctx.bench, kept, reference, equal)
        ctx.bench = kept
    doc = Document(title)
    rows = _rows_used(df, ctx)
    ctx.rows, ctx.reproductions = rows, reproductions
    doc.add(*summary.summary(ctx, rows, reproductions))
    doc.add(
        Para(
            "Every number in this report is a stored measurement or derived from stored "
            "measurements by a formula named in `numbers.json` (ratios, fitted exponents, "
            "crossovers, means, counts); `rows.csv` holds the stored rows used. Cases without "
            "numbers say why."
        )
    )
    first = Document(title, list(doc.blocks))
    for section in SECTIONS:
        doc.add(*section(ctx))
    doc.blocks = [_captioned(b) for b in doc.blocks]
    files = ReportFiles(
        markdown=out_dir / "report.md",
        html=out_dir / "report.html",
        summary=out_dir / "summary.md",
        csv=out_dir / "rows.csv",
        runs=out_dir / "runs.json",
        numbers=out_dir / "numbers.json",
        plots=list(ctx.plots),
    )
    with writing(files.markdown):
        files.markdown.write_text(to_markdown(doc))
    with writing(files.summary):
        files.summary.write_text(to_markdown(first, links_to=files.markdown.name))
    with writing(files.html):
        files.html.write_text(to_html(doc))
    with writing(files.csv):
        _csv_frame(rows).to_csv(files.csv, index=False)
    with writing(files.numbers):
        ctx.ledger.write(files.numbers)
    used = set(ctx.cases["run_id"]) if not ctx.cases.empty else set()
    used_runs = [{**r, "meta": _portable_meta(r["meta"])} for r in ctx.runs if r["run_id"] in used]
    with writing(files.runs):
        files.runs.write_text(json.dumps(used_runs, indent=1, default=str))
    measured_by = sorted({c for r in used_runs if (c := _command_of(r["meta"]))}) or measured_by
    measured_by = [portable_command(c) for c in measured_by]
    meta = {
        "generator": GENERATOR,  # the folder's mark: zoo report may write here again
        "title": title,
        "reference": reference,  # what the ratios divide by: --from keeps it
        "command": command,
        "measured_by": measured_by,
        "built": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        # the names this build owns (what it wrote, and the picture --screenshot adds after it): a
        # rebuild drops only these, never a user's file of a like name, nor keeps a stale picture
        "files": sorted({p.name for p in out_dir.iterdir()} | {META_FILE, FIRST_SCREEN}),
    }
    with writing(out_dir / META_FILE) as path:
        path.write_text(json.dumps(meta, indent=1))
    return files


def _csv_frame(rows: Any) -> Any:
    """The rows as rows.csv holds them: the store's export columns, facts as JSON text (as `zoo
    results --format csv` writes them), so `zoo report --from` reads them back."""
    frame = rows.drop(columns=[c for c in rows.columns if c.startswith("cfg.")])
    if "facts" in frame.columns:
        facts = [json.dumps(facts_of(f), sort_keys=True, default=str) for f in frame["facts"]]
        frame = frame.assign(facts=facts)
    return frame


def _captioned(block: Any) -> Any:
    """An image with its figure's caption (plots.CAPTIONS) when its section gave none."""
    if isinstance(block, Image) and not block.caption:
        return Image(block.path, block.alt, caption(block.path))
    return block


def _portable_meta(meta: Any) -> Any:
    """A run's metadata as a published runs.json holds it: its command's store named as a
    reader can type it (paths.portable_command), never the measuring machine's folders."""
    if not isinstance(meta, dict):
        return meta
    out = dict(meta)
    if isinstance(out.get("command"), str):
        out["command"] = portable_command(out["command"])
    if isinstance(out.get("argv"), list):
        out["argv"] = portable_words([str(w) for w in out["argv"]])
    return out


def _command_of(meta: dict[str, Any]) -> str:
    """The `zoo ...` command line a run's metadata records ('' when none): as recorded
    (commands/recording.py), or from an older run's argv list or interpreter path."""
    if isinstance(meta.get("argv"), list):
        return shlex.join(["zoo", *map(str, meta["argv"])])
    command = str(meta.get("command") or "").strip()
    first, _, rest = command.partition(" ")
    if Path(first).name in ("zoo", "__main__.py"):
        return f"zoo {rest}".strip()
    return command


def _rows_used(df: Any, ctx: Context) -> Any:
    import pandas as pd

    frame = df if hasattr(df, "columns") else pd.DataFrame(list(df))
    if ctx.cases.empty or frame.empty:
        return frame.iloc[0:0]
    used = set(zip(ctx.cases["run_id"], ctx.cases["case_key"]))
    keep = [(r, c) in used for r, c in zip(frame["run_id"], frame["case_key"])]
    return frame[keep].reset_index(drop=True)
