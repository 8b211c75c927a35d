"""Every table of a report is at most document.MAX_COLUMNS wide, in report.md and report.html alike:
cells that belong together are merged, tables that answer different questions are split, and a
matrix of any width is cut into narrower tables that repeat the columns naming its rows."""

from __future__ import annotations

import re

import pytest

from attention_zoo.report.document import MAX_COLUMNS, Table, narrow_tables

from .report_fixtures import make_store


def _headers(markdown: str) -> list[list[str]]:
    """The header cells of every table of a Markdown text (a '|' line after a line that is not)."""
    found, previous = [], ""
    for line in markdown.splitlines():
        if line.startswith("|") and not previous.startswith("|"):
            found.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
        previous = line
    return found


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    pytest.importorskip("pandas")
    pytest.importorskip("seaborn")
    from attention_zoo.report import build_report
    from attention_zoo.reproduce import REPRODUCTIONS
    from attention_zoo.store import ResultStore

    from .decoding_fixtures import make_decode_store

    folder = tmp_path_factory.mktemp("width")
    path = make_store(make_decode_store(folder / "s.sqlite"), busy=True, counted=True)
    with ResultStore(path) as store:
        rows, runs = store.to_dataframe(), store.runs()
    return build_report(rows, folder / "rep", runs=runs, reproductions=list(REPRODUCTIONS))


# A header (or part of one) of each kind of table the fixtures fill, section by section.
KINDS = (
    "setting | L | fastest exact",  # the Summary
    "setting | time crossover",
    "L | cheapest token, exact",
    "L | fastest exact",  # the Headline: the best of each class, time, memory, counted
    "L | variant | time (median) ± IQR [ms] | time x sdpa | TFLOP/s | % peak | note",
    "L | variant | peak (measured) [MiB] | memory x sdpa | state [MiB] | predicted [MiB]",
    "L | variant | state [MiB] | state x sdpa | peak per token [MiB]",
    "L | variant | GFLOP | approx_error random | approx_error peaked",
    "variant | computes | time exponent",  # Scaling
    "variant \\ beats",
    "L | variant | decodes",  # Decoding
    "recompute / own",
    "params / block",  # Fair comparison
    "approx_error (peaked)",  # Fidelity x cost
    "trained with",  # Accuracy x cost
    "train \\ eval",  # Task results and Table 2
    "memory per layer",  # Block variants
    "chunk size",
    "claim | setting",
    "case | computes",  # Cases without numbers
    "run | kind | started | git commit | machine | load start → end | busy",  # Provenance
)


@pytest.mark.slow
def test_no_table_of_a_full_report_is_wider_than_seven_columns(built):
    headers = _headers(built.markdown.read_text())
    assert max(len(h) for h in headers) <= MAX_COLUMNS == 7
    joined = [" | ".join(h) for h in headers]
    assert [k for k in KINDS if not any(k in h for h in joined)] == []  # every kind is there
    html = built.html.read_text()
    heads = re.findall(r"<thead><tr>(.*?)</tr></thead>", html)
    assert [h.count("<th>") for h in heads] == [len(h) for h in headers]  # the same tables


def test_a_table_wider_than_seven_columns_is_refused():
    Table(list("abcdefg"), [list("1234567")])
    with pytest.raises(ValueError, match="at most 7 columns, not 8"):
        Table(list("abcdefgh"), [])


def test_a_wide_matrix_is_cut_into_tables_repeating_its_row_names():
    headers = ["mechanism", "L", *(f"w{i}" for i in range(9))]
    rows = [["`a`", "64", *(str(i) for i in range(9))], ["`b`", "128", *"abcdefghi"]]
    tables = narrow_tables(headers, rows, key=2, caption="A cell: a mean.")
    assert [t.headers[:2] for t in tables] == [["mechanism", "L"]] * 2
    assert [len(t.headers) for t in tables] == [7, 6]  # 9 columns shared out: 5 and 4
    assert [h for t in tables for h in t.headers[2:]] == headers[2:]  # each once, in order
    assert [c for t in tables for c in t.rows[1][2:]] == rows[1][2:]
    assert [t.caption for t in tables] == ["A cell: a mean.", ""]
    assert narrow_tables(headers[:7], rows) == [Table(headers[:7], rows)]  # narrow: as it is
