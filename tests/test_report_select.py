"""One selection rule for every section: the task numbers printed come from the rows the report
lists (rows.csv, provenance)."""

from __future__ import annotations

import pytest

pytest.importorskip("pandas")

from attention_zoo.report.builder import select
from attention_zoo.store import ResultStore
from attention_zoo.tasks.results import case_config, encode_metric

from .report_fixtures import TASK_LENGTH, TASK_MODEL


def _task_config(seed: int) -> dict:
    ident = {"task": "duplication", "preset": "tiny", "backend": "shared-qk",
             "length": TASK_LENGTH, "seed": seed}  # fmt: skip
    spec = {"preset": "tiny", "task": {"name": "duplication", "seq_len": TASK_LENGTH},
            "model": {**TASK_MODEL, "attn_layers": ["shared-qk"]}, "seed": seed}  # fmt: skip
    return case_config(ident, spec)


def test_an_ok_task_run_followed_by_a_failed_one_is_listed_with_its_numbers(tmp_path):
    with ResultStore(tmp_path / "s.sqlite") as store:
        ok = store.start_run(kind="task", device="cpu")
        store.add_rows(
            ok, None, _task_config(0), [(encode_metric("accuracy", "trained"), 0.9, "fraction")]
        )
        store.add_rows(ok, None, _task_config(1), [], status="error", error="diverged")
        store.finish_run(ok)
        failed = store.start_run(kind="task", device="cpu")
        store.add_rows(failed, None, _task_config(0), [], status="error", error="killed")
        store.finish_run(failed)
        ctx = select(store.to_dataframe(), store.runs())
    printed = set(zip(ctx.tasks["run_id"], ctx.tasks["case_key"]))
    listed = set(zip(ctx.cases["run_id"], ctx.cases["case_key"]))
    assert {r for r, _ in printed} == {ok}
    assert printed <= listed  # the run the numbers come from is in rows.csv and provenance
    # a case without any ok run still shows its (latest) failure
    assert list(ctx.cases[ctx.cases["status"] != "ok"]["error"]) == ["diverged"]
