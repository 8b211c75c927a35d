"""The report's Decoding section and the summary's generation lines, on a synthetic store of decode
cases with known answers: a KV cache's time per token linear in the context, running sums and a
window flat, recomputing the prefix quadratic."""

from __future__ import annotations

import pytest

pytest.importorskip("pandas")
pytest.importorskip("seaborn")

from attention_zoo.report import build_report
from attention_zoo.report.ledger import load_ledger, numbers_in, recompute
from attention_zoo.store import ResultStore

from .decoding_fixtures import make_decode_store
from .test_report_trace import _fetcher, _printed_numbers

pytestmark = pytest.mark.slow  # builds a report with its plots


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder = tmp_path_factory.mktemp("decoding")
    path = make_decode_store(folder / "s.sqlite")
    with ResultStore(path) as store:
        files = build_report(store.to_dataframe(), folder / "rep", runs=store.runs())
    return path, files


def _section(markdown: str) -> str:
    start = markdown.index("## Decoding")
    end = markdown.find("\n## ", start + 1)
    return markdown[start : end if end > 0 else None]


def test_the_section_plots_and_tabulates_every_decode_case(built):
    _, files = built
    text = _section(files.markdown.read_text())
    assert any(p.name.startswith("decoding-") for p in files.plots)
    for backend in ("sdpa", "linear", "local", "sdpa (recompute)", "nystrom"):
        assert f"| `{backend}` · " in text  # with what it computes
    assert "own state, equal to the causal forward" in text
    assert "recomputes the whole prefix every token" in text
    # prefill time of sdpa's prompt at 4096: 1e-6 * 4096 s = 4.10 ms
    row = next(line for line in text.splitlines() if line.startswith("| 4096 | `sdpa` · exact |"))
    assert "| 4.10 |" in row


def test_the_scaling_plot_of_a_decode_setting_shows_its_state(built):
    """The Scaling plot of a decode setting draws what its table fits: the decoding state, not
    the peak of the step."""
    _, files = built
    markdown = files.markdown.read_text()
    decode = [ln for ln in markdown.splitlines() if ln.startswith("![") and "decode" in ln]
    scaling = [ln for ln in decode if "scaling-" in ln]
    assert scaling and all(ln.startswith("![time and decoding state against") for ln in scaling)


def test_exponents_and_the_recompute_ratio_follow_the_laws(built):
    _, files = built
    text = _section(files.markdown.read_text())
    exponents = {
        line.split("|")[1].strip(): line.split("|")[3].strip()
        for line in text.splitlines()
        if line.startswith("| `") and line.count("|") == 6
    }
    assert exponents == {
        "`linear`": "0.00",
        "`local`": "0.00",
        "`sdpa`": "1.00",
        "`sdpa (recompute)`": "2.00",
    }
    # recompute / own at 16384: 1e-9 L^2 / (1e-8 L) = L / 10
    assert "| 16384 | `sdpa` | 1,638x |" in text


def test_the_summary_names_the_cheapest_token_per_context_length(built):
    _, files = built
    summary = files.summary.read_text()
    assert "Generation (`attention, decode" in summary
    # 1024: sdpa 1.02e-5 s (exact), linear 2e-4 s < local 3e-4 s; the smallest state: linear
    assert "| 1024 | `sdpa` 0.0102 ms | `linear` 0.200 ms | `linear` 0.0635 MiB |" in summary
    assert "(recompute)` " not in summary.split("Generation")[1].split("\n\n")[2]


def test_every_number_of_the_section_traces_to_the_store(built):
    path, files = built
    fetch, db = _fetcher(path)
    entries = load_ledger(files.numbers)
    recorded = {token for e in entries for token in numbers_in(e.text)}
    printed = _printed_numbers(_section(files.markdown.read_text()))
    assert printed and not set(printed) - recorded
    for e in entries:
        assert recompute(e, fetch) == e.text, e
    db.close()
