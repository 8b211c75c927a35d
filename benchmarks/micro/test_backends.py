"""Micro-benchmarks of every registered backend's core with pytest-benchmark: forward and
forward+backward at two short lengths, one thread, grouped so each table compares the backends.

    pytest benchmarks/micro --benchmark-only                          # every backend
    ZOO_IMPORT=my_attention pytest benchmarks/micro --benchmark-only -k "mine or sdpa"
    pytest benchmarks/micro --benchmark-only --benchmark-save=before  # then, after a change:
    pytest benchmarks/micro --benchmark-only --benchmark-compare      # against the last saved run

The cases come from the registry (plugins and ZOO_IMPORT modules included) and a case the backend
cannot run here is skipped with the registry's reason. History across commits and the regression
gate are asv's job (benchmarks/bench_*.py); this is the quick look a plugin author takes. The folder
has no __init__.py, so asv, which imports every module of the benchmarks package, never sees it.
"""

from __future__ import annotations

import pytest
import torch

from attention_zoo.attention.spec import BACKENDS
from attention_zoo.measure.cases import BenchCase, build_runnable
from attention_zoo.measure.timing import fixed_threads, synchronize
from attention_zoo.plugins import load_plugins_for_command

load_plugins_for_command()  # installed plugins and ZOO_IMPORT modules (a failing one: an error)
LENGTHS = (256, 1024)
MODES = ("forward", "forward+backward")
THREADS = 1  # a comparison of code must not depend on how busy the other cores are
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def micro_cases() -> list[BenchCase]:
    """One causal core case per registered backend, length and mode."""
    return [
        BenchCase(target="attention", backend=name, seq_len=n, mode=mode, device=DEVICE)
        for name in BACKENDS.names()
        for n in LENGTHS
        for mode in MODES
    ]


@pytest.mark.parametrize("case", micro_cases(), ids=lambda c: f"{c.backend}-{c.seq_len}-{c.mode}")
def test_core(benchmark, case: BenchCase) -> None:
    if reason := case.unsupported():
        pytest.skip(reason)
    benchmark.group = f"attention core, L={case.seq_len}, {case.mode}, {case.device}"
    benchmark.extra_info.update(case.to_dict())
    with fixed_threads(THREADS) as threads:
        benchmark.extra_info["threads"] = threads
        step = build_runnable(case).step

        def timed() -> None:
            step()
            synchronize(case.device)

        timed()  # warm-up: lazy state and first-call costs stay out of the timings
        benchmark(timed)
