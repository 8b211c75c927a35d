"""The regression gate (benchmarks/scripts/gate.py): its verdicts on asv's results."""

from __future__ import annotations

import math
import sys
from pathlib import Path

from attention_zoo.measure import baseline

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "scripts"))
import gate  # noqa: E402  (a script, importable from its folder)

NAME = "bench_attention.Time.time_step('cpu', 1, 'attention', 'local', 1024, 'forward')"
TRACKED = "bench_attention.Memory.track_tracked_peak_bytes('cpu', 'attention', 'local', 1024)"
MEASURED = "bench_attention.Memory.track_peak_bytes('cpu', 'attention', 'local', 1024)"


def row(base: float | None, head: float | None, kind: str = "time", unit: str = "seconds"):
    name = {"time": NAME, "bytes": TRACKED}.get(unit if kind == "track" else kind, MEASURED)
    return gate.Measurement(name, kind, unit, base, head)


def test_time_beyond_the_factor_is_a_regression_naming_both_numbers_and_the_ratio() -> None:
    regressions, _, failures = gate.judge([row(0.010, 0.015)], factor=1.3)
    assert len(regressions) == 1 and not failures
    line = regressions[0]
    assert NAME in line and "10.0ms" in line and "15.0ms" in line and "1.50x" in line
    assert gate.judge([row(0.010, 0.0125)], factor=1.3) == ([], [], [])
    assert gate.judge([row(0.010, 0.005)], factor=1.3) == ([], [], [])  # faster is no regression


def test_deterministic_tracks_are_exact_and_a_decrease_is_a_note() -> None:
    regressions, _, _ = gate.judge([row(1000, 1020, "track", "bytes")], factor=1.3)
    assert regressions and "1.02x" in regressions[0] and "1,020 bytes" in regressions[0]
    assert TRACKED in regressions[0]
    assert gate.judge([row(1000, 1005, "track", "bytes")], factor=1.3) == ([], [], [])
    regressions, notes, _ = gate.judge([row(1000, 700, "track", "bytes")], factor=1.3)
    assert not regressions and "less than before" in notes[0]
    # the measured peak is not deterministic in the catalogue: shown by asv, not judged
    measured = gate.Measurement(MEASURED, "track", "bytes", 1000, 2000)
    assert gate.judge([measured], factor=1.3) == ([], [], [])


def test_failures_and_skips_are_told_apart() -> None:
    _, _, failures = gate.judge([row(0.01, None)], factor=1.3)
    assert failures and "failed on the head commit" in failures[0]
    _, notes, failures = gate.judge([row(None, 0.01)], factor=1.3)
    assert not failures and "base commit only" in notes[0]
    assert gate.judge([row(math.nan, math.nan)], factor=1.3) == ([], [], [])
    _, notes, _ = gate.judge([row(math.nan, 0.01)], factor=1.3)
    assert "one commit only" in notes[0]


def test_the_fast_subset_selects_cores_and_one_block() -> None:
    import re

    time = "bench_attention.Time.time_step"
    names = [
        NAME,
        f"{time}('cpu', 1, 'attention', 'shared-qk', 1024, 'forward+backward')",
        "bench_blocks.ResidualLayers.time_train_step('cpu', 1, 'reversible', 2)",
    ]
    others = [
        f"{time}('cpu', 1, 'block', 'local', 1024, 'forward')",
        f"{time}('cpu', 1, 'attention', 'local', 4096, 'forward')",
        f"{time}('cuda', 1, 'attention', 'local', 1024, 'forward')",
    ]
    assert all(any(re.search(r, n) for r in gate.FAST_BENCH) for n in names)
    assert not any(re.search(r, n) for r in gate.FAST_BENCH for n in others)


def test_a_memory_decrease_asks_for_a_look_instead_of_calling_it_an_improvement() -> None:
    (less,) = baseline.compare({"tracked_peak_bytes": 1000}, {"tracked_peak_bytes": 800})
    assert not less.increase and "LESS" in less.message() and "Look" in less.message()
    assert "improvement" not in less.message()
    (more,) = baseline.compare({"tracked_peak_bytes": 1000}, {"tracked_peak_bytes": 1200})
    assert more.increase and "1.200x" in more.message() and "1,200" in more.message()
