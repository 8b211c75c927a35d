"""Decoding is compared by what it keeps: a decode case's memory ratio and its leanest ranking
come from its decoding state (the step's transient peak its own column), in `zoo bench`'s table,
the report's Headline and its Summary, each named in the column header."""

from __future__ import annotations

import pytest

pytest.importorskip("pandas")

from attention_zoo.measure.table import comparison_table, group_cases
from attention_zoo.report.builder import select
from attention_zoo.report.cost import headline
from attention_zoo.report.document import Table
from attention_zoo.report.summary import summary
from attention_zoo.store import ResultStore

from .decoding_fixtures import decode_case

# (backend) -> (peak of one step above resident, state per sequence), as measured at 16k on CPU:
# a KV cache's step allocates little and keeps much; a window and running sums the other way
MEMORY = {
    "sdpa": (5.5 * 2**10, 32 * 2**20),
    "local": (262.4 * 2**10, 255.1 * 2**10),
    "linear": (70.0 * 2**10, 65.0 * 2**10),
}


@pytest.fixture
def store(tmp_path):
    with ResultStore(tmp_path / "s.sqlite") as s:
        run = s.start_run(kind="bench", device="cpu")
        for backend, (peak, state) in MEMORY.items():
            for n in (1024, 16384):
                rows = [("time_median", 1e-3, "s"), ("time_iqr", 1e-5, "s")]
                rows += [("time_min", 1e-3, "s"), ("peak_bytes", peak, "bytes")]
                rows += [("state_bytes", state, "bytes")]
                s.add_rows(run, None, decode_case(backend, n, "decode").to_dict(), rows)
        s.finish_run(run)
        yield s, run


def _ratios(table: str, header: str) -> dict[tuple[str, str], float]:
    """{(backend, L): ratio} of a right-aligned column of the bench table, under its header."""
    head, _, *lines = table.splitlines()
    at = slice(head.index(header), head.index(header) + len(header))
    return {
        tuple(line.split()[1:3]): float(line[at].strip().rstrip("x"))
        for line in lines
        if line.startswith("attention") and line[at].strip() != "-"
    }


def test_the_bench_table_divides_a_decode_case_by_its_state(store):
    s, run = store
    table = comparison_table(group_cases(s.rows(run)), reference="sdpa")
    assert "state x sdpa" in table.splitlines()[0] and "memory x sdpa" not in table
    ratios = _ratios(table, "state x sdpa")
    assert ratios[("local", "16384")] < 1 and ratios[("linear", "16384")] < 1
    assert ratios[("sdpa", "16384")] == 1.0


def _summary_and_headline(s):
    ctx = select(s.to_dataframe(), s.runs())
    tables = [b for b in summary(ctx, None, []) if isinstance(b, Table)]
    heads = [b for b in headline(ctx) if isinstance(b, Table)]
    return tables, heads


@pytest.mark.slow
def test_the_summary_ranks_decoding_by_state_and_agrees_with_smallest_state(store):
    s, _ = store
    tables, _ = _summary_and_headline(s)
    main, _, generation = tables  # the crossovers' table between
    lean = main.headers.index("leanest not exact (state)")
    at_16k = next(r for r in main.rows if r[1] == "16384")
    assert at_16k[lean].startswith("`linear` ") and at_16k[lean].endswith("x")
    assert float(at_16k[lean].split()[1].rstrip("x")) < 1
    smallest = next(r for r in generation.rows if r[0] == "16384")[-1]
    assert smallest.startswith("`linear` ")


def test_the_headline_shows_the_state_ratio_and_the_steps_peak_apart(store):
    s, _ = store
    _, heads = _summary_and_headline(s)
    full = next(t for t in heads if "state x sdpa" in t.headers)  # the memory table
    assert not any("memory x sdpa" in t.headers for t in heads)
    assert any(h.startswith("peak per token") for h in full.headers)
    ratio = full.headers.index("state x sdpa")
    local = next(r for r in full.rows if r[0] == "16384" and r[1] == "`local`")
    assert float(local[ratio].rstrip("x")) < 1
