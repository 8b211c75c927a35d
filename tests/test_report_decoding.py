"""The report's Decoding section and the summary's generation lines, on a synthetic store of decode
cases with known answers: a KV cache's time per token linear in the context, running sums and a
window flat, recomputing the prefix quadratic."""

from __future__ import annotations

import pytest

pytest.importorskip("pandas")
pytest.importorskip("seaborn")

from attention_zoo.measure.cases import BenchCase
from attention_zoo.report import build_report
from attention_zoo.report.ledger import load_ledger, numbers_in, recompute
from attention_zoo.store import ResultStore

from .test_report_trace import _fetcher, _printed_numbers

pytestmark = pytest.mark.slow  # builds a report with its plots

LENGTHS = (1024, 4096, 16384)
NEW = 64
# (backend, decoder) -> (time per token [s] = a * L^p, state bytes at L)
LAWS = {
    ("sdpa", "own"): (1e-8, 1.0, lambda n: 2056 * (n + NEW)),
    ("sdpa", "recompute"): (1e-9, 2.0, lambda n: 3080 * (n + NEW)),
    ("linear", "own"): (2e-4, 0.0, lambda n: 66560),
    ("local", "own"): (3e-4, 0.0, lambda n: 261239),
}


def _case(backend: str, n: int, mode: str, decoder: str = "own") -> BenchCase:
    label = f"{backend} (recompute)" if decoder == "recompute" else ""
    return BenchCase(
        target="attention", backend=backend, seq_len=n, mode=mode, new_tokens=NEW,
        decoder=decoder, label=label,
    )  # fmt: skip


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder = tmp_path_factory.mktemp("decoding")
    path = folder / "s.sqlite"
    with ResultStore(path) as store:
        run = store.start_run(kind="bench", device="cpu")
        for (backend, decoder), (a, p, state) in LAWS.items():
            for n in LENGTHS:
                t = a * n**p
                rows = [("time_median", t, "s"), ("time_iqr", t / 50, "s"), ("time_min", t, "s")]
                rows += [("peak_bytes", 1000.0, "bytes"), ("state_bytes", state(n), "bytes")]
                case = _case(backend, n, "decode", decoder)
                store.add_rows(run, None, case.to_dict(), rows)
                if decoder == "own":
                    prefill = [("time_median", 1e-6 * n, "s"), ("state_bytes", state(n), "bytes")]
                    store.add_rows(run, None, _case(backend, n, "prefill").to_dict(), prefill)
        store.add_rows(
            run, None, _case("nystrom", 1024, "decode").to_dict(), [], status="skipped",
            error="backend 'nystrom' cannot decode token by token",
        )  # fmt: skip
        store.finish_run(run)
        store._db.execute("UPDATE runs SET load_start = 0.0, load_end = 0.0, cpu_count = 2")
        store._db.commit()
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
        assert f"| `{backend}` |" in text
    assert "own state, equal to the causal forward" in text
    assert "recomputes the whole prefix every token" in text
    # prefill time of sdpa's prompt at 4096: 1e-6 * 4096 s = 4.10 ms
    row = next(line for line in text.splitlines() if line.startswith("| 4096 | `sdpa` |"))
    assert "4.10" in row


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
