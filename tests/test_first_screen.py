"""The first screen answers on a busy machine: CPU steps timed by the process's CPU time at one
thread are never set aside as busy, so the Summary names a fastest variant per class at every
length, a crossover where three lengths hold one, says plainly where the reference beats every
approximation, and counts claims only when a reproduction measured something."""

from __future__ import annotations

import pytest

pytest.importorskip("pandas")

from attention_zoo.errors import ConfigError
from attention_zoo.measure.cases import BenchCase
from attention_zoo.measure.runner import MeasureSettings, measure_case
from attention_zoo.measure.status import OK
from attention_zoo.measure.trust import CPU_TIMED, timing_marks
from attention_zoo.report.builder import select
from attention_zoo.report.document import Para, Table
from attention_zoo.report.summary import summary
from attention_zoo.reproduce import REPRODUCTIONS, get_reproduction
from attention_zoo.store import ResultStore

from .report_fixtures import block_case

LENGTHS = (256, 512, 1024)
# mode -> backend -> seconds per step at length n (forward: local crosses sdpa near L = 1000)
TIMES = {
    "forward": {
        "sdpa": lambda n: 1e-8 * n**2,
        "local": lambda n: 1e-5 * n,
        "linear": lambda n: 2e-5 * n,
    },
    "forward+backward": {
        "sdpa": lambda n: 1e-9 * n**2,
        "local": lambda n: 1e-5 * n,
        "linear": lambda n: 2e-5 * n,
    },
}


@pytest.mark.slow
def test_the_cpu_clock_times_one_thread_and_reads_no_load():
    with pytest.raises(ConfigError, match="needs threads = 1"):
        MeasureSettings(clock="cpu", threads=2)
    case = BenchCase(target="attention", backend="sdpa", seq_len=64)
    settings = MeasureSettings(metrics=("time",), threads=1, clock="cpu", time_budget_s=0)
    result = measure_case(case, settings)
    assert result.status == OK and result.value(CPU_TIMED) == 1.0
    assert result.value("free_cores") is None and result.value("time_median") > 0
    metrics = {r.metric: r.value for r in result.rows}
    marks = timing_marks(metrics, threads=1, device="cpu", run_busy="load 40 on 2 cores")
    assert [m for m in marks if m.kind == "busy"] == []


@pytest.fixture
def busy_store(tmp_path):
    """CPU-timed cases of a run whose load at its start was far above its cores."""
    with ResultStore(tmp_path / "s.sqlite") as store:
        run = store.start_run(kind="bench", device="cpu")
        for mode, laws in TIMES.items():
            for backend, law in laws.items():
                for n in LENGTHS:
                    t = law(n)
                    rows = [("time_median", t, "s"), ("time_iqr", t / 50, "s")]
                    rows += [("time_min", t, "s"), (CPU_TIMED, 1.0, "flag")]
                    store.add_rows(run, None, block_case(backend, n, mode).to_dict(), rows)
        store.finish_run(run)
        store._db.execute("UPDATE runs SET load_start = 40.0, load_end = 40.0, cpu_count = 2")
        store._db.commit()
        yield store


def _blocks(store, reproductions=()):
    ctx = select(store.to_dataframe(), store.runs())
    return summary(ctx, store.to_dataframe(), reproductions)


@pytest.mark.slow
def test_a_busy_run_timed_by_cpu_time_names_winners_and_a_crossover(busy_store):
    blocks = _blocks(busy_store)
    table = next(b for b in blocks if isinstance(b, Table))
    fast_exact, fast_other = (
        table.headers.index(h) for h in ("fastest exact", "fastest not exact")
    )
    assert len(table.rows) == 2 * len(LENGTHS)
    for row in table.rows:
        assert row[fast_exact].startswith("`sdpa` ") and "not ranked" not in " ".join(row)
        assert row[fast_other].startswith("`local` ")
    crossovers = next(b for b in blocks if isinstance(b, Table) and "time crossover" in b.headers)
    forward = next(r for r in crossovers.rows if r[0].startswith("`forward`"))
    crossing = forward[crossovers.headers.index("time crossover")]
    assert crossing.startswith("`local` below `sdpa`: from L ≈ "), crossing
    text = " ".join(b.text for b in blocks if isinstance(b, Para))
    assert "timed by the process's CPU time at one thread" in text
    assert "Set aside" not in text  # nothing busy: the load does not inflate CPU time


@pytest.mark.slow
def test_the_reference_beating_every_approximation_is_said_plainly(busy_store):
    (said,) = [
        b.text for b in _blocks(busy_store) if isinstance(b, Para) and "is faster than" in b.text
    ]
    assert said.startswith("`sdpa` is faster than every not-exact variant measured at every")
    assert "in `forward+backward` (L 256 to 1024: `linear`, `local`):" in said  # those it beat
    assert "`forward` (" not in said  # local gets below sdpa there


@pytest.mark.slow
def test_claims_are_counted_only_when_a_reproduction_measured_something(busy_store):
    everything = [get_reproduction(name) for name in REPRODUCTIONS.names()]
    paras = [b.text for b in _blocks(busy_store, everything) if isinstance(b, Para)]
    assert not any("claims by verdict" in p for p in paras)
