"""Timing ratios measured in one run, and deterministic metrics (FLOPs, predicted and tracked peak
bytes) against the committed baseline file.

Ratios, never absolute times: the machine may be shared (measured: a second busy process changes
absolute CPU times by up to 7x), so each comparison times both sides round-robin in the same run.
Baselines: one representative case per backend runs in the README's test command (`slow`), the rest
in CI's long pass; after an intended change, python benchmarks/scripts/update_baselines.py (it
compares time first) rewrites the file: review and commit the diff.
"""

from __future__ import annotations

import pytest

from attention_zoo.attention.spec import BACKENDS
from attention_zoo.measure import baseline
from attention_zoo.measure.cases import BenchCase, build_runnable
from attention_zoo.measure.timing import fixed_threads, time_interleaved

BASELINE = baseline.load() if baseline.DEFAULT_PATH.exists() else {"cases": {}}
LONG = (pytest.mark.slow, pytest.mark.long)  # CI runs them: python -m pytest -m long


def interleaved_medians(cases: dict[str, BenchCase], repeats: int = 3) -> dict[str, float]:
    """Median seconds per step of each case, timed round-robin in one run with 2 threads."""
    with fixed_threads(2):
        steps = {name: build_runnable(case).step for name, case in cases.items()}
        stats = time_interleaved(
            steps, warmup=0, repeats=repeats
        )  # median of 3 absorbs the cold first call
    return {name: s.median for name, s in stats.items()}


def need(*names: str) -> None:
    missing = [n for n in names if n not in BACKENDS]
    if missing:
        pytest.skip(f"backend(s) {missing} not registered yet")


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.alone
def test_lsh_and_local_beat_full_at_8k() -> None:
    """Forward of the attention core at 8,192 tokens (4 heads of 64, causal): full attention
    materialises 1 GiB of scores, lsh (4 hashes) and local work chunk by chunk."""
    need("lsh", "local")
    full = BenchCase(target="attention", backend="full", seq_len=8192, mode="forward")
    lsh = full.replace(backend="lsh", options={"num_hashes": 4})
    t = interleaved_medians({"full": full, "lsh": lsh, "local": full.replace(backend="local")})
    assert t["lsh"] < 0.8 * t["full"], (
        f"lsh (4 hashes) took {t['lsh'] / t['full']:.2f}x full's time at 8k"
    )
    assert t["local"] < 0.5 * t["full"], (
        f"local took {t['local'] / t['full']:.2f}x full's time at 8k"
    )


@pytest.mark.slow
def test_sdpa_beats_naive_full_at_2k() -> None:
    full = BenchCase(target="attention", backend="full", seq_len=2048, mode="forward+backward")
    sdpa = full.replace(backend="sdpa")
    t = interleaved_medians({"full": full, "sdpa": sdpa})
    assert t["sdpa"] < t["full"], (
        f"SDPA took {t['sdpa'] / t['full']:.2f}x the naive attention's time at 2k"
    )


# ---- deterministic metrics against the committed baseline ------------------------------------
# (that the file covers every registered backend and residual: tests/test_coverage.py)


QUICK = {case.key() for case in baseline.quick_cases()}


@pytest.mark.slow
@pytest.mark.parametrize(
    "key",
    [
        pytest.param(key, id=BASELINE["cases"][key]["name"], marks=() if key in QUICK else LONG)
        for key in sorted(BASELINE["cases"])
    ]
    or ["<none>"],
)
def test_deterministic_metrics_match_baseline(key: str) -> None:
    entry = BASELINE["cases"].get(key)
    if entry is None:
        pytest.skip("no baseline file")
    case = BenchCase.from_dict(entry["case"])
    if reason := baseline.case_available(case):
        pytest.skip(reason)
    differences = baseline.compare(entry, baseline.compute(case))
    assert not differences, (
        f"{entry['name']}:\n  "
        + "\n  ".join(d.message() for d in differences)
        + "\nIf the change meant it: python benchmarks/scripts/update_baselines.py (it compares "
        "time first), review and commit the diff."
    )
