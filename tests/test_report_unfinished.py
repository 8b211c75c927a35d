"""A report built from a run that had not finished (still writing, killed or interrupted) says so
at the top of its Summary; a finished run's report does not."""

from __future__ import annotations

import pytest

pytest.importorskip("pandas")

from attention_zoo.report.builder import select
from attention_zoo.report.document import Para
from attention_zoo.report.summary import summary
from attention_zoo.store import ResultStore

CONFIG = {"target": "attention", "backend": "sdpa", "seq_len": 64, "mode": "forward"}


def _first_lines(store: ResultStore) -> list[str]:
    ctx = select(store.to_dataframe(), store.runs())
    return [b.text for b in summary(ctx, None, [])[1:3] if isinstance(b, Para)]


@pytest.mark.parametrize("interrupted", [False, True])
def test_a_report_of_an_unfinished_run_says_so_first(tmp_path, interrupted):
    with ResultStore(tmp_path / "s.sqlite") as store:
        run = store.start_run(kind="bench", meta={"command": "zoo bench"})
        store.add_rows(run, None, CONFIG, [("time_median", 1e-3, "s")])
        if interrupted:
            store.mark_interrupted(run)
        first = _first_lines(store)[0]
        status = "interrupted" if interrupted else "unfinished"
        assert first.startswith(f"**Not finished**: run `{run}` ({status}) had not finished")
        store.finish_run(run)
        assert not any("Not finished" in line for line in _first_lines(store))
