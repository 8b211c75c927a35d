"""Provenance: a run is busy when any of its shown cases was measured busy."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pandas")

import pandas as pd

from attention_zoo.report.context import Context
from attention_zoo.report.document import Table
from attention_zoo.report.misc import provenance


def _run(run_id: str) -> dict:
    return {
        "run_id": run_id,
        "kind": "bench",
        "started_at": 0.0,
        "git_commit": "abc",
        "torch_version": "2",
        "device_name": "cpu",
        "threads": 1,
        "cpu_count": 2,
        "load_start": 1.0,
        "load_end": 1.0,
    }


def test_a_run_is_busy_when_any_of_its_cases_was_busy_not_only_its_first():
    cases = pd.DataFrame(
        {
            "run_id": ["a", "a", "b", "c"],
            "case_key": ["k1", "k2", "k3", "k4"],
            "busy": [False, True, False, None],
        }
    )
    ctx = Context(
        cases=cases, bench=None, tasks=None, runs=[_run(r) for r in "abc"], out_dir=Path(".")
    )
    (table,) = [b for b in provenance(ctx) if isinstance(b, Table)]
    busy = {row[0]: row[-1] for row in table.rows}
    assert busy == {"`a`": "yes", "`b`": "no", "`c`": "unknown"}
