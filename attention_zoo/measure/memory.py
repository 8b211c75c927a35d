"""Peak bytes allocated during a call: the measured memory numbers.

CPU, measured: torch.profiler memory events see every allocation the allocator makes, kernel scratch
included; when checked, they matched process RSS (glibc told to return freed blocks at once,
MALLOC_MMAP_THRESHOLD_=65536) closely, while plain RSS with the default malloc was far off either
way. So `profiled_peak`, not RSS, is the CPU "measured" number; `rss_peak` is kept only as a
cross-check with that known bias.
CUDA, measured: `cuda_peak` reads the caching allocator's peak statistics, reset before the call.
"""

from __future__ import annotations

import gc
import os
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile


@dataclass(frozen=True)
class PeakMemory:
    """Bytes relative to what was allocated when the call began."""

    peak_bytes: int  # highest live total above the starting point, during the call
    net_bytes: int  # still allocated when the call returned (its result, caches, ...)
    allocations: int  # number of allocation events seen


def profiled_peak(fn: Callable[[], Any], device: str = "cpu") -> tuple[Any, PeakMemory]:
    """Run fn() under the profiler; return its result and the peak of live allocated bytes.

    device: "cpu" counts host allocations; "cuda" counts device allocations seen by the profiler
    (on CUDA prefer torch.cuda peak statistics, which are exact and cheaper).
    """
    want = torch.autograd.DeviceType.CPU if device == "cpu" else torch.autograd.DeviceType.CUDA
    # Kineto writes two stderr lines per profiler start/stop ("USDT: ... profiler_start"), which
    # would flood CLI output; level 6 silences them. Read at its first start; a user's value wins.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    with profile(
        activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False
    ) as prof:
        result = fn()
    events = [
        e
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and e.device_type() == want
    ]
    events.sort(key=lambda e: e.start_ns())
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    return result, PeakMemory(
        peak_bytes=peak, net_bytes=live, allocations=sum(e.nbytes() > 0 for e in events)
    )


@dataclass(frozen=True)
class CudaPeak:
    """torch.cuda allocator statistics around one call."""

    peak_bytes: int  # peak allocated during the call minus what was allocated when it began
    total_peak_bytes: int  # peak allocated during the call, resident model/inputs included
    resident_bytes: int  # allocated when the call began


def cuda_peak(fn: Callable[[], Any], device: str | torch.device = "cuda") -> tuple[Any, CudaPeak]:
    """Run fn() with CUDA peak statistics reset first; exact for the caching allocator."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    start = torch.cuda.memory_allocated(device)
    result = fn()
    torch.cuda.synchronize(device)
    total = torch.cuda.max_memory_allocated(device)
    return result, CudaPeak(peak_bytes=total - start, total_peak_bytes=total, resident_bytes=start)


@dataclass(frozen=True)
class RssPeak:
    """Process resident-set growth during a call (a cross-check only, see the module docstring)."""

    peak_bytes: int  # VmHWM after the call minus VmRSS before it
    malloc_mmap_threshold: str | None  # MALLOC_MMAP_THRESHOLD_ as set for this process, if at all


_STATUS = "/proc/self/status"


def _status_kib(field: str) -> int:
    with open(_STATUS) as f:
        m = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.MULTILINE)
    if m is None:
        raise OSError(f"{field} not in {_STATUS}")
    return int(m.group(1))


def rss_supported() -> bool:
    """True where the peak RSS can be reset per call (Linux >= 4.0: /proc/self/clear_refs)."""
    try:
        _status_kib("VmHWM")
        return os.access("/proc/self/clear_refs", os.W_OK)
    except OSError:
        return False


def rss_taken(device: str, groups: Collection[str]) -> bool:
    """Whether measuring a case on `device` takes an RSS step: a cross-check of the measured peak,
    so only with the memory group, and only of the CPU's, where the OS can reset it."""
    return "memory" in groups and torch.device(device).type != "cuda" and rss_supported()


def rss_peak(fn: Callable[[], Any]) -> tuple[Any, RssPeak]:
    """Run fn(); peak RSS growth, resetting the high-water mark first (writes '5' to clear_refs).

    Known bias: malloc keeps freed blocks and reuses them, so this is far off the profiler's
    number either way with the default glibc malloc; much closer with MALLOC_MMAP_THRESHOLD_=65536.
    A heap that is never trimmed (the benchmarks' steady allocator) can hide a call's growth whole.
    Earlier garbage is collected first: freed during fn, it would hide fn's own growth.
    """
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status_kib("VmRSS")
    result = fn()
    peak = _status_kib("VmHWM")
    return result, RssPeak(
        peak_bytes=max(0, peak - before) * 1024,
        malloc_mmap_threshold=os.environ.get("MALLOC_MMAP_THRESHOLD_"),
    )
