"""A case's FLOP rate on this machine, so its time can be predicted from its FLOP count before it
runs: its own step timed once at a short length (CALIBRATION_LENGTH tokens at most), per device,
threads and torch version, and kept in the user's cache (`$XDG_CACHE_HOME/attention-zoo/
rates.json`) for every later run. A variant's own step, because one machine-wide rate cannot
serve every mechanism: a materialised softmax spends most of its time outside the matmuls its
FLOPs count, and a fused causal kernel skips half of the product it is counted for."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from .cases import BenchCase, build_runnable
from .env import device_name
from .load import free_cores, read_cpu, too_few_free
from .predict import predict_flops
from .timing import CPU_CLOCK, WALL, synchronize, time_once
from .units import significant

CALIBRATION_LENGTH = 1024  # tokens of the timed probe: short for every backend
CALIBRATION_CALLS = 3  # timed calls after one warm-up; the fastest is kept


@dataclass(frozen=True)
class Rate:
    """FLOPs per second a case's step computes at here, and where the number came from."""

    flops_per_s: float
    key: str  # what it was measured for: the probe case, device, threads, torch version
    source: str  # "measured now" or the cache file it was read from

    def seconds(self, flops: float) -> float:
        """The time `flops` take at this rate."""
        return flops / self.flops_per_s

    def describe(self) -> str:
        return f"{significant(self.flops_per_s / 1e9)} GFLOP/s"


def cache_file() -> Path:
    """Where measured rates are kept (the XDG cache folder, else ~/.cache)."""
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "attention-zoo" / "rates.json"


def probe_case(case: BenchCase) -> BenchCase:
    """The case whose step is timed for `case`'s rate: the same case at most
    CALIBRATION_LENGTH tokens long."""
    return dataclasses.replace(case, seq_len=min(case.seq_len, CALIBRATION_LENGTH))


def case_rate(case: BenchCase, probe_flops: int | None = None) -> Rate:
    """The rate of `case`'s step at torch's current thread count: read from the cache, else its
    probe timed now and written there (one thread on a CPU: timed by its CPU time; more, by the
    wall clock, not kept when other processes held the cores meanwhile, which would keep a slow
    rate; a cache that cannot be written is skipped). `probe_flops`: the probe's FLOPs where a
    prediction already counted them (else counted here)."""
    probe = probe_case(case)
    key = _key(case)
    path = cache_file()
    if (known := _cached(_read(path), key)) is not None:
        return Rate(known, key, str(path))
    # one thread on a CPU: its CPU time, what the step costs, which other processes cannot inflate
    threads = torch.get_num_threads()
    clock = CPU_CLOCK if torch.device(case.device).type == "cpu" and threads == 1 else WALL
    before = read_cpu()
    flops = predict_flops(probe) if probe_flops is None else probe_flops
    rate = max(flops, 1) / _fastest_step(probe, clock)
    free = free_cores(before, read_cpu())
    if clock == WALL and free is not None and too_few_free(free, threads):
        return Rate(rate, key, "measured now on a busy machine (not cached)")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fresh = path.with_suffix(f".{os.getpid()}.tmp")
        fresh.write_text(json.dumps({**_read(path), key: rate}, indent=1, sort_keys=True))
        fresh.replace(path)  # atomic: concurrent runs never read half a file
    except OSError:
        pass
    return Rate(rate, key, "measured now")


def probes_to_time(cases: Iterable[BenchCase]) -> int:
    """How many probes predicting `cases` would time now: the distinct ones whose rates are not
    cached (a case whose probe cannot even be named is left to the run, which reports it)."""
    known, keys = _read(cache_file()), set()
    for case in cases:
        try:
            key = _key(case)
        except Exception:
            continue
        if _cached(known, key) is None:
            keys.add(key)
    return len(keys)


def _key(case: BenchCase) -> str:
    """What a rate is kept under: the probe case, device, threads and torch version."""
    probe = probe_case(case)
    return (
        f"{probe.name()} [{probe.key()}]; {device_name(case.device)}; "
        f"threads={torch.get_num_threads()}; torch {torch.__version__}"
    )


def _cached(known: dict[str, float], key: str) -> float | None:
    """The rate kept under `key` in the cache's contents `known`, if a usable one is there."""
    value = known.get(key)
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def _read(path: Path) -> dict[str, float]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _fastest_step(case: BenchCase, clock: str) -> float:
    """Seconds of the fastest of CALIBRATION_CALLS steps of `case` by `clock`, after one
    warm-up."""
    runnable = build_runnable(case)
    runnable.step()
    synchronize(case.device)
    return min(time_once(runnable.step, case.device, clock) for _ in range(CALIBRATION_CALLS))
