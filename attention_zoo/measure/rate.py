"""This machine's attention FLOP rate, so a case's time can be predicted from its FLOP count before
it runs: one SDPA forward timed once per device, dtype, thread count and torch version, and kept
in the user's cache (`$XDG_CACHE_HOME/attention-zoo/rates.json`) for every later run."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import sdpa_flop_count

from .env import device_name
from .timing import synchronize
from .units import significant

CALIBRATION_SHAPE = (1, 4, 1024, 64)  # (b, h, n, d): 4 * n * n * d * h, about 1 GFLOP
CALIBRATION_CALLS = 5  # timed calls after one warm-up; the fastest is kept


@dataclass(frozen=True)
class Rate:
    """FLOPs per second this machine computes attention at, and where the number came from."""

    flops_per_s: float
    key: str  # what it was measured for: device, dtype, threads, torch version
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


def machine_rate(device: str, dtype: torch.dtype) -> Rate:
    """The rate for `device` and `dtype` at torch's current thread count: read from the cache,
    else measured now and written there (a cache that cannot be written is skipped)."""
    key = (
        f"{device_name(device)}; {str(dtype).removeprefix('torch.')}; "
        f"threads={torch.get_num_threads()}; torch {torch.__version__}"
    )
    path = cache_file()
    known = _read(path)
    if isinstance(known.get(key), (int, float)) and known[key] > 0:
        return Rate(float(known[key]), key, str(path))
    rate = _measure(device, dtype)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fresh = path.with_suffix(f".{os.getpid()}.tmp")
        fresh.write_text(json.dumps({**_read(path), key: rate}, indent=1, sort_keys=True))
        fresh.replace(path)  # atomic: concurrent runs never read half a file
    except OSError:
        pass
    return Rate(rate, key, "measured now")


def _read(path: Path) -> dict[str, float]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _measure(device: str, dtype: torch.dtype) -> float:
    """FLOPs per second of a bidirectional SDPA forward of CALIBRATION_SHAPE (its fastest call)."""
    q, k, v = (torch.randn(CALIBRATION_SHAPE, device=device, dtype=dtype) for _ in range(3))
    flops = sdpa_flop_count(q.shape, k.shape, v.shape)
    best = float("inf")
    with torch.no_grad():
        for i in range(CALIBRATION_CALLS + 1):
            synchronize(device)
            start = time.perf_counter()
            F.scaled_dot_product_attention(q, k, v)
            synchronize(device)
            if i:  # the first call warms up
                best = min(best, time.perf_counter() - start)
    return flops / best
