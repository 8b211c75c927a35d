"""Shared helpers of the asv suite: the registry-driven parameters and case building with skips.

Sizes can be changed without editing code: ZOO_ASV_LENGTHS="1024,4096", ZOO_ASV_THREADS=2.
A case a backend cannot run (device, dtype, causality) raises NotImplementedError in setup, which
asv shows as n/a instead of a failure. Parameters come from the registries and units from the
metric catalogue, so a new backend, residual variant or metric needs no edit here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from attention_zoo.attention.spec import default_device, list_backends
from attention_zoo.blocks.residual import RESIDUALS
from attention_zoo.measure.cases import BenchCase, Runnable, build_runnable
from attention_zoo.measure.memory import cuda_peak, profiled_peak
from attention_zoo.measure.metrics import METRICS
from attention_zoo.measure.predict import predict_case
from attention_zoo.measure.timing import synchronize
from attention_zoo.measure.tracker import tracked_peak

DEVICE = os.environ.get("ZOO_ASV_DEVICE", default_device())
LENGTHS = [int(x) for x in os.environ.get("ZOO_ASV_LENGTHS", "1024,4096").split(",")]
THREADS = int(os.environ.get("ZOO_ASV_THREADS", "2"))
MODES = ["forward", "forward+backward"]
F = TypeVar("F", bound=Callable[..., Any])


def backend_names() -> list[str]:
    """Every registered backend, available here or not (unavailable ones are skipped in setup)."""
    return [spec.name for spec in list_backends()]


def residual_names() -> list[str]:
    """Every registered residual variant."""
    return RESIDUALS.names()


def tracks(metric: str) -> Callable[[F], F]:
    """Mark an asv track_* method as measuring `metric`: its unit comes from the catalogue."""

    def mark(method: F) -> F:
        method.metric = metric
        method.unit = METRICS[metric].unit
        return method

    return mark


def setup(*args: Any, **kwargs: Any) -> None:
    """Run before every benchmark (asv calls a module-level setup): fixed threads and seed."""
    torch.set_num_threads(THREADS)
    torch.manual_seed(0)


def require_backends(*names: str) -> None:
    known = set(backend_names())
    missing = [n for n in names if n not in known]
    if missing:
        raise NotImplementedError(
            f"backend(s) {missing} not registered (registered: {sorted(known)})"
        )


def case_for(**fields: Any) -> BenchCase:
    """A BenchCase on DEVICE; NotImplementedError when it cannot run here."""
    fields.setdefault("device", DEVICE)
    case = BenchCase(**fields)
    if reason := case.unsupported():
        raise NotImplementedError(reason)
    return case


def build(case: BenchCase) -> Runnable:
    """Build and warm up (one untimed step)."""
    runnable = build_runnable(case)
    runnable.step()
    synchronize(case.device)
    return runnable


def run_synced(runnable: Runnable) -> None:
    runnable.step()
    synchronize(runnable.case.device)


def measured_peak(runnable: Runnable) -> int:
    """Peak bytes above resident of one step: CUDA allocator stats on GPU, the profiler on CPU."""
    device = runnable.case.device
    if torch.device(device).type == "cuda":
        return cuda_peak(runnable.step, device)[1].peak_bytes
    return profiled_peak(runnable.step)[1].peak_bytes


def tracked(runnable: Runnable) -> int:
    return tracked_peak(runnable.step)[1].peak_bytes


def predicted(case: BenchCase) -> int:
    return predict_case(case).peak_bytes


def flops(case: BenchCase) -> int:
    return predict_case(case).flops


def _warm_up() -> None:
    """Pay FakeTensorMode's one-time set-up (~1 s) at import, so that asv's forkserver, which
    imports the suite once and forks per benchmark, does not pay it per fork. Only fake tensors
    here: real kernels or the profiler would start threads, and a process forked after that can
    hang."""
    if os.environ.get("ZOO_ASV_NO_WARMUP"):
        return
    case = BenchCase(
        target="block", backend="full", seq_len=8, hidden=8, num_heads=2, head_dim=4, mode="forward"
    )
    predict_case(case)


_warm_up()
