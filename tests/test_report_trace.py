"""Traceability: every number printed in report.md comes from the store it was built from.

Each number outside code spans must be a number the builder recorded in numbers.json, and every
recorded number is recomputed here from the store by plain SQL: a stored value formatted, or a
named formula over stored values, or a published constant of a reproduced paper."""

from __future__ import annotations

import json
import re
import sqlite3

import pytest

pytest.importorskip("pandas")
pytest.importorskip("seaborn")

from attention_zoo.report.ledger import config_value, fmt, load_ledger, numbers_in, recompute
from attention_zoo.reproduce.reformer.published import table2

from .report_fixtures import build_busy_report

pytestmark = pytest.mark.slow  # builds a whole report with its plots
RUN_FIELDS = ("load_start", "load_end", "cpu_count", "threads")


def _fetcher(path):
    db = sqlite3.connect(path)

    def fetch(ref):
        run_id, case_key, what = ref
        if what.startswith("run."):
            name = what.removeprefix("run.")
            assert name in RUN_FIELDS, what
            (value,) = db.execute(f"SELECT {name} FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            return {}, float(value)
        (config,) = db.execute(
            "SELECT config FROM cases WHERE run_id = ? AND case_key = ?", (run_id, case_key)
        ).fetchone()
        config = json.loads(config)
        if what.startswith("config."):
            return config, float(config_value(config, what))
        rows = db.execute(
            "SELECT value FROM results WHERE run_id = ? AND case_key = ? AND metric = ?",
            (run_id, case_key, what),
        ).fetchall()
        assert len(rows) == 1, f"{ref}: {len(rows)} stored rows"
        return config, rows[0][0]

    return fetch, db


def _printed_numbers(markdown: str) -> list[str]:
    """Numbers of the report's text: code spans (labels, settings, ids), image lines and the
    section title 'Table 2' hold identifiers, not data."""
    text = re.sub(r"`[^`]*`", " ", markdown)
    text = "\n".join(line for line in text.splitlines() if not line.startswith("!["))
    text = text.replace("Table 2", " ")
    return numbers_in(text)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return build_busy_report(tmp_path_factory.mktemp("trace"))


def test_every_number_in_the_report_is_a_recorded_one(report):
    _, files = report
    entries = load_ledger(files.numbers)
    recorded = {token for e in entries for token in numbers_in(e.text)}
    printed = _printed_numbers(files.markdown.read_text())
    assert len(printed) > 50  # the synthetic store fills every section
    assert sorted(set(printed) - recorded) == []


def test_every_recorded_number_is_recomputed_from_the_store(report):
    path, files = report
    fetch, db = _fetcher(path)
    entries = load_ledger(files.numbers)
    kinds = {e.source for e in entries}
    assert {"value", "derived", "published"} <= kinds
    assert {e.formula for e in entries if e.source == "derived"} >= {
        "ratio", "exponent", "crossover", "mean", "slope"
    }  # fmt: skip
    for e in entries:
        if e.source in ("value", "derived"):
            assert recompute(e, fetch) == e.text, e
        elif e.source == "published":
            train, evaluation = re.fullmatch(r"TABLE2\[(.+),(.+)\]", e.constant).groups()
            assert fmt(e.kind, table2()[train][evaluation]) == e.text
    db.close()


def test_a_wrong_reference_is_caught(report):
    """The check can fail: the same entry pointed at another stored row gives another text."""
    path, files = report
    fetch, db = _fetcher(path)
    ratios = [e for e in load_ledger(files.numbers) if e.formula == "ratio"]
    # the reference's own row divides two equal numbers: swapping them changes nothing
    ratio = next(e for e in ratios if e.refs[0] != e.refs[1] and e.text != "1.00x")
    ratio.refs = [ratio.refs[1], ratio.refs[0]]
    assert recompute(ratio, fetch) != ratio.text
    db.close()
