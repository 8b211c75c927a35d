"""Measurement primitives: timing statistics, measured/tracked memory vs analytic sizes, FLOPs."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
import torch

from attention_zoo.errors import ConfigError
from attention_zoo.measure.cases import BenchCase
from attention_zoo.measure.flops import count_flops
from attention_zoo.measure.memory import profiled_peak, rss_supported
from attention_zoo.measure.runner import MeasureSettings, measure_case
from attention_zoo.measure.status import OK
from attention_zoo.measure.timing import fixed_threads, summarize, time_interleaved
from attention_zoo.measure.tracker import tracked_peak

M, K, N = 256, 128, 512  # one matmul of known shapes


def test_summarize_statistics() -> None:
    s = summarize([5.0, 1.0, 2.0, 3.0, 4.0], warmup=0, device="cpu")
    assert (s.median, s.min, s.mean, s.repeats) == (3.0, 1.0, 3.0, 5)
    assert s.iqr == pytest.approx(2.0)  # inclusive quartiles of 1..5: 2 and 4


def _alone(fn, **kwargs):
    return time_interleaved({"fn": fn}, max_repeats=1000, **kwargs)["fn"]


def test_one_callable_is_timed_to_its_budget_and_its_minimum() -> None:
    calls = []
    stats = _alone(lambda: calls.append(time.sleep(0.002)), warmup=2, budget_s=0.03, repeats=3)
    assert stats.warmup == 2 and len(calls) == stats.repeats + 2
    assert 3 <= stats.repeats <= 20  # ~15 fit the budget; never fewer than min_repeats
    assert stats.min >= 0.002 and stats.min <= stats.median
    assert stats.threads == torch.get_num_threads()
    slow = _alone(lambda: time.sleep(0.02), warmup=0, budget_s=0.001, repeats=3)
    assert slow.repeats == 3  # one call exceeds the budget, still three samples


def test_time_interleaved_runs_round_robin() -> None:
    order: list[str] = []
    stats = time_interleaved(
        {"a": lambda: order.append("a"), "b": lambda: order.append("b")}, warmup=1, repeats=3
    )
    assert order == ["a", "b"] + ["a", "b"] * 3
    assert stats["a"].repeats == stats["b"].repeats == 3


def test_fixed_threads_sets_and_restores() -> None:
    before = torch.get_num_threads()
    with fixed_threads(1) as n:
        assert n == 1 == torch.get_num_threads()
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="threads must be >= 1"), fixed_threads(0):
        pass


def test_profiled_peak_equals_analytic_matmul_size() -> None:
    a, b = torch.randn(M, K), torch.randn(K, N)
    out, peak = profiled_peak(lambda: a @ b)
    assert peak.peak_bytes == M * N * 4  # exactly the output, nothing else
    assert peak.net_bytes == M * N * 4  # still alive: it is the result
    del out


def test_profiled_peak_sees_temporaries() -> None:
    a = torch.randn(M, K)

    def fn() -> torch.Tensor:
        t = a @ a.T  # (M, M) temporary, freed before the sum returns
        return t.sum()

    _, peak = profiled_peak(fn)
    assert peak.peak_bytes >= M * M * 4
    assert peak.net_bytes < 1024  # only the scalar survives (allocator rounds it up to 64 B or so)


def test_tracked_peak_equals_analytic_size_and_ignores_views() -> None:
    a, b = torch.randn(M, K), torch.randn(K, N)
    _, peak = tracked_peak(lambda: (a @ b).T.contiguous().view(-1))
    # matmul output + the contiguous copy, both (M, N); the transposed view and view(-1) allocate
    # nothing
    assert peak.peak_bytes == 2 * M * N * 4
    assert peak.allocations == 2


def test_tracked_peak_works_on_meta_tensors() -> None:
    a, b = torch.empty(M, K, device="meta"), torch.empty(K, N, device="meta")
    _, peak = tracked_peak(lambda: a @ b)
    assert peak.peak_bytes == M * N * 4


def test_tracked_peak_counts_frees() -> None:
    a = torch.randn(M, K)

    def fn() -> None:
        for _ in range(3):
            t = a @ a.T  # each iteration frees the previous (M, M)
            del t

    _, peak = tracked_peak(fn)
    assert peak.peak_bytes == M * M * 4 and peak.net_bytes == 0


# Runs rss_peak in a fresh interpreter, printing the peak in bytes: in a test worker, earlier tests
# shape glibc's heap (benchmarks' steady allocator never trims it), and a 64 MiB tensor can then
# reuse pages the process already holds, which RSS cannot see.
RSS_SCRIPT = """
import gc, sys, torch
from attention_zoo.measure.memory import rss_peak
size = 64 * 2**20
class Cycle:  # unreachable, freed only by a collection
    def __init__(self):
        self.me, self.t = self, torch.ones(size // 4)
if sys.argv[1] == "garbage":
    gc.disable()
    for _ in range(3):
        Cycle()
    _, rss = rss_peak(lambda: (gc.collect(), torch.ones(size // 4).sum()))
else:
    _, rss = rss_peak(lambda: torch.ones(size // 4).sum())
print(rss.peak_bytes)
"""


def rss_peak_in_a_fresh_process(case: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", RSS_SCRIPT, case], capture_output=True, text=True, check=True
    )
    return int(out.stdout.split()[-1])


@pytest.mark.slow
@pytest.mark.skipif(not rss_supported(), reason="needs /proc/self/clear_refs (Linux)")
def test_rss_peak_sees_a_large_allocation() -> None:
    size = 64 * 2**20  # RSS is a cross-check with known bias: it must see the 64 MiB
    assert 0.9 * size <= rss_peak_in_a_fresh_process("plain") <= 1.5 * size


@pytest.mark.slow
@pytest.mark.skipif(not rss_supported(), reason="needs /proc/self/clear_refs (Linux)")
def test_rss_peak_is_not_hidden_by_earlier_garbage_freed_while_it_runs() -> None:
    size = 64 * 2**20  # 3 x 64 MiB of garbage, freed while fn runs, would hide fn's 64 MiB
    assert 0.9 * size <= rss_peak_in_a_fresh_process("garbage") <= 1.5 * size


@pytest.mark.slow
@pytest.mark.skipif(not rss_supported(), reason="needs /proc/self/clear_refs (Linux)")
def test_rss_cross_checks_the_measured_peak_only_where_it_is_measured() -> None:
    """RSS costs one more step: a run of the deterministic metrics alone (the baseline's) skips
    it, a run measuring memory keeps it beside the profiler's peak."""
    case = BenchCase(backend="sdpa", seq_len=64, mode="forward")

    def names(*groups: str) -> set[str]:
        result = measure_case(case, MeasureSettings(metrics=groups, time_budget_s=0.0))
        assert result.status == OK, result.error
        return {row.metric for row in result.rows}

    alone = names("crosscheck")
    assert "rss_peak_bytes" not in alone and "tracked_peak_bytes" in alone
    assert {"rss_peak_bytes", "peak_bytes", "tracked_peak_bytes"} <= names("memory", "crosscheck")


def test_flops_of_matmul_and_cpu_flash_attention() -> None:
    a, b = torch.randn(M, K), torch.randn(K, N)
    assert count_flops(lambda: a @ b)[1] == 2 * M * K * N
    q = torch.randn(1, 2, 128, 32, requires_grad=True)

    def fwd_bwd() -> None:
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()

    # PyTorch leaves the CPU flash kernel uncounted; ours counts it like the CUDA kernels:
    # forward 2 matmuls, backward 5 (2.5x), each 2 * b * h * n * n * d.
    one = 2 * 1 * 2 * 128 * 128 * 32
    assert count_flops(fwd_bwd)[1] == 2 * one + 5 * one


def test_parse_bytes_units() -> None:
    from attention_zoo.measure.units import format_bytes, parse_bytes

    assert parse_bytes("8GB") == 8 * 10**9 and parse_bytes("8GiB") == 8 * 2**30
    assert parse_bytes("512MiB") == 512 * 2**20 and parse_bytes("1.5") == int(1.5 * 2**30)
    assert format_bytes(3 * 2**20) == "3.0 MiB" and format_bytes(None) == "-"
    with pytest.raises(ValueError, match=re.escape("write e.g. 8GiB")):
        parse_bytes("8 potatoes")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"threads": -2}, "threads must be an integer >= 1, got -2"),
        ({"threads": 2**31}, "threads must be an integer from 1 to 2147483647"),
        ({"warmup": -1}, "warmup must be an integer >= 0, got -1"),
        ({"min_repeats": 0}, "min_repeats must be an integer >= 1, got 0"),
        ({"max_repeats": "9"}, "max_repeats must be an integer >= 1, got '9'"),
        ({"min_repeats": 5, "max_repeats": 2}, "min_repeats (5) is more than max_repeats (2)"),
        ({"time_budget_s": "x"}, "time_budget_s must be a number of seconds, got 'x'"),
        ({"time_budget_s": -1.0}, "time_budget_s must be a number of seconds >= 0, got -1.0"),
        ({"time_budget_s": float("nan")}, "time_budget_s must be a number of seconds, got nan"),
        ({"time_limit_s": 0}, "time_limit_s must be a number of seconds > 0, got 0"),
        ({"timeout_s": True}, "timeout_s must be a number of seconds, got True"),
        ({"memory_limit_bytes": 0}, "memory_limit_bytes must be a whole number of bytes > 0"),
        ({"interleave": "false"}, "interleave must be true or false, got 'false'"),
        ({"metrics": (["time"],)}, "metrics must be a list of strings, got (['time'],)"),
    ],
)
def test_measure_settings_refuse_what_a_run_could_not_use(changes: dict, message: str) -> None:
    """Up front, one line each, not a traceback from timing.py halfway through a run."""
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}"):
        MeasureSettings(**changes)


def test_measure_settings_take_the_edges() -> None:
    settings = MeasureSettings(time_budget_s=0, warmup=0, min_repeats=1, max_repeats=1, threads=1)
    assert settings.time_limit_s is None and settings.timeout_s is None
    assert MeasureSettings(time_limit_s=0.5, timeout_s=2, memory_limit_bytes=1).timeout_s == 2
