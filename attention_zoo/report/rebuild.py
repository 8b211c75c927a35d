"""A published report folder's own inputs, to rebuild it without the store it came from: rows.csv
(the stored rows used), runs.json (their runs) and report.json (the commands that measured them).

Folders written before runs.json existed keep their runs only in report.md's provenance table;
those are read back from it (loads as printed, to two decimals; the run's metadata is empty)."""

from __future__ import annotations

import calendar
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UsageError

ROWS, RUNS, META = "rows.csv", "runs.json", "report.json"
NEEDED = ("run_id", "case_key", "status", "metric", "value", "config", "threads")  # rows.csv's
PROVENANCE = "## Provenance"
# an older report.md's provenance columns -> the runs table's fields (a folder written since has
# runs.json, and its provenance table merges these cells)
COLUMNS = {
    "run": "run_id",
    "kind": "kind",
    "started": "started_at",
    "git commit": "git_commit",
    "torch": "torch_version",
    "device": "device_name",
    "threads": "threads",
    "cores": "cpu_count",
    "load at start": "load_start",
    "load at end": "load_end",
}

RUN_FIELDS = {"meta", "finished_at", "fingerprint", *COLUMNS.values()}  # a report reads them


@dataclass(frozen=True, kw_only=True)
class FolderInputs:
    rows: Any  # DataFrame of the store's export columns
    runs: list[dict[str, Any]]
    measured_by: list[str]  # report.json's, for runs whose metadata lost their command line
    title: str
    reference: str | None  # what its ratios divided by (None: a folder from before it was kept)


def folder_inputs(folder: str | Path) -> FolderInputs:
    """What `zoo report --from FOLDER` rebuilds the folder from."""
    import pandas as pd

    folder = Path(folder)
    if not (folder / ROWS).is_file():
        raise UsageError(
            f"{folder} holds no {ROWS}: --from takes a folder written by zoo report "
            "(rebuild any other one from its store: zoo report --store FILE --out FOLDER)"
        )
    try:
        rows = pd.read_csv(folder / ROWS, dtype={"run_id": str, "case_key": str})
    except (ValueError, pd.errors.ParserError) as err:  # EmptyDataError is a ValueError
        raise _damaged(folder / ROWS, str(err)) from None
    if missing := [c for c in NEEDED if c not in rows.columns]:
        raise _damaged(folder / ROWS, f"no column {', '.join(missing)}")
    for config in rows["config"].dropna().unique():
        if not isinstance(config, str) or not isinstance(_json(folder / ROWS, config), dict):
            raise _damaged(folder / ROWS, "a config is not a JSON object")
    meta = _json(folder / META, (folder / META).read_text()) if (folder / META).is_file() else {}
    if not isinstance(meta, dict):
        raise _damaged(folder / META, "not a JSON object")
    if (folder / RUNS).is_file():
        runs = _json(folder / RUNS, (folder / RUNS).read_text())
        if not isinstance(runs, list) or not all(
            isinstance(r, dict) and RUN_FIELDS <= r.keys() and isinstance(r["meta"], dict)
            for r in runs
        ):
            fields = ", ".join(sorted(RUN_FIELDS))
            raise _damaged(folder / RUNS, f"not a list of runs, each with {fields}")
    elif (folder / "report.md").is_file():
        runs = runs_from_markdown((folder / "report.md").read_text())
    else:
        raise _damaged(folder, f"no {RUNS} (nor a report.md that lists its runs)")
    return FolderInputs(
        rows=rows,
        runs=runs,
        measured_by=list(meta.get("measured_by", [])),
        title=meta.get("title", ""),
        reference=meta.get("reference"),
    )


def _damaged(path: Path, why: str) -> UsageError:
    return UsageError(
        f"--from: {path} is damaged ({why.splitlines()[0] if why else 'unreadable'}); rebuild "
        "the folder from its store: zoo report --store FILE --out FOLDER"
    )


def _json(path: Path, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise _damaged(path, f"not JSON: {err}") from None


def runs_from_markdown(markdown: str) -> list[dict[str, Any]]:
    """The runs of report.md's provenance table (an older folder without runs.json)."""
    if PROVENANCE not in markdown:
        return []
    lines = markdown.split(PROVENANCE, 1)[1].splitlines()
    table = [line for line in lines if line.startswith("|")]
    if len(table) < 3:
        return []
    headers = _cells(table[0])
    runs = []
    for line in table[2:]:
        cells = dict(zip(headers, _cells(line)))
        run: dict[str, Any] = {"meta": {}, "finished_at": None, "fingerprint": None}  # RUN_FIELDS
        for column, name in COLUMNS.items():
            run[name] = _value(name, cells.get(column, "-"))
        runs.append(run)
    return runs


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def _value(name: str, cell: str) -> Any:
    text = re.sub(r"`([^`]*)`.*", r"\1", cell).strip()
    if text in ("-", ""):
        return None
    if name == "started_at":
        return float(calendar.timegm(time.strptime(text, "%Y-%m-%d %H:%M UTC")))
    if name in ("threads", "cpu_count"):
        return int(text.replace(",", ""))
    if name in ("load_start", "load_end"):
        return float(text)
    return text
