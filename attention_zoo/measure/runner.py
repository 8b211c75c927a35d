"""Measure one case: prediction and FLOPs (fake tensors), measured memory, cross-checks, time.

Metrics (one stored row each; absent when not measured):
  time_median, time_iqr, time_min [s], time_repeats [count]
  peak_bytes          measured peak above resident: CPU torch.profiler, CUDA allocator peak stats
  peak_total_bytes    CUDA: allocator peak incl. resident; CPU: resident_bytes + peak_bytes
  resident_bytes      parameters, buffers, inputs, optimizer state (live between steps)
  tracked_peak_bytes  cross-check: StorageTracker on the real device (misses kernel scratch;
                      autograd accumulates out of place under it: up to ~32 MiB high)
  rss_peak_bytes      cross-check, CPU: peak RSS growth (malloc caching: off by 0.4x-1.9x)
  predicted_peak_bytes, predicted_resident_bytes, predicted_total_bytes
                      fake tensors, no allocation
  flops               FlopCounterMode on fake tensors (matmul/attention FLOPs of one step)
"""

from __future__ import annotations

import gc
import logging
import time
import traceback
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from .cases import BenchCase, Runnable, build_runnable
from .memory import cuda_peak, profiled_peak, rss_peak, rss_supported
from .predict import Prediction, predict_case
from .timing import fixed_threads, time_call
from .tracker import tracked_peak

log = logging.getLogger(__name__)

OK, OOM, ERROR, SKIPPED = "ok", "oom", "error", "skipped"
METRIC_GROUPS = ("time", "memory", "crosscheck", "predict", "flops")


class Metric(NamedTuple):
    """One stored row: a metric name, its value and unit (a plain (name, value, unit) tuple)."""

    metric: str
    value: float
    unit: str


@dataclass(frozen=True, kw_only=True)
class MeasureSettings:
    """How to measure; stored with the run, not part of a case's identity."""

    time_budget_s: float = 1.0  # keep timing until this much time is spent...
    warmup: int = 1  # ...after this many untimed calls
    min_repeats: int = 3
    max_repeats: int = 100
    threads: int | None = None  # torch threads while measuring; None: leave as is
    metrics: tuple[str, ...] = METRIC_GROUPS  # which groups to measure
    memory_limit_bytes: int | None = None  # don't run a case predicted to need more (status oom)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.metrics) - set(METRIC_GROUPS))
        if unknown:
            raise ValueError(
                f"unknown metric group(s) {unknown}; known: {', '.join(METRIC_GROUPS)}"
            )


@dataclass(frozen=True, kw_only=True)
class CaseResult:
    """The outcome of one case: status, metric rows (maybe partial), error text."""

    case: BenchCase
    status: str  # ok, oom, error, skipped
    rows: list[Metric] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0

    def value(self, metric: str) -> float | None:
        return next((r.value for r in self.rows if r.metric == metric), None)


def is_oom(exc: BaseException) -> bool:
    """True for out-of-memory errors of any allocator (CUDA, CPU malloc, a process memory limit)."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(
        s in text
        for s in (
            "can't allocate memory",
            "out of memory",
            "not enough memory",
            "cannot allocate memory",
        )
    )


def describe_error(exc: BaseException) -> str:
    """'Type: message (at file:line)' — enough to find it, short enough for a table."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def prediction_rows(p: Prediction) -> list[Metric]:
    return [
        Metric("predicted_peak_bytes", p.peak_bytes, "bytes"),
        Metric("predicted_resident_bytes", p.resident_bytes, "bytes"),
        Metric("predicted_total_bytes", p.total_bytes, "bytes"),
    ]


DEFAULT_SETTINGS = MeasureSettings()


def measure_case(case: BenchCase, settings: MeasureSettings = DEFAULT_SETTINGS) -> CaseResult:
    """Measure `case`; a failing case is a status (error/oom), only KeyboardInterrupt raises."""
    start = time.perf_counter()
    rows: list[Metric] = []
    notes: list[str] = []

    def done(status: str, error: str | None = None) -> CaseResult:
        text = "; ".join(([error] if error else []) + notes) or None
        return CaseResult(
            case=case, status=status, rows=rows, error=text, seconds=time.perf_counter() - start
        )

    if reason := _unsupported(case):
        return done(SKIPPED, reason)
    with fixed_threads(settings.threads):
        prediction = None
        if {"predict", "flops"} & set(settings.metrics) or settings.memory_limit_bytes:
            try:
                prediction = predict_case(case)
            except Exception as exc:
                notes.append(f"prediction failed: {describe_error(exc)}")
        if prediction is not None:
            if "predict" in settings.metrics:
                rows.extend(prediction_rows(prediction))
            if "flops" in settings.metrics:
                rows.append(Metric("flops", prediction.flops, "flop"))
            limit = settings.memory_limit_bytes
            if limit is not None and prediction.total_bytes > limit:
                return done(
                    OOM,
                    f"not run: predicted {prediction.total_bytes / 2**20:.1f} MiB > memory limit "
                    f"{limit / 2**20:.1f} MiB",
                )
        if not {"time", "memory", "crosscheck"} & set(settings.metrics):
            return done(OK)
        runnable = None
        try:
            runnable = build_runnable(case)
            runnable.step()  # warm-up: lazy state (optimizer moments, caches) becomes resident
            rows.extend(_measure(runnable, settings))
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # any failure is a stored result, never a crash
            status = OOM if is_oom(exc) else ERROR
            log.debug("case %s failed", case.name(), exc_info=True)
            return done(status, describe_error(exc))
        finally:
            del runnable
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return done(OK)


def _unsupported(case: BenchCase) -> str | None:
    if torch.device(case.device).type == "cuda" and not torch.cuda.is_available():
        return (
            "no CUDA device is visible here (predict CUDA memory with 'zoo memory --devices cuda')"
        )
    if case.target == "model":
        try:
            from .. import config, model  # noqa: F401  (the Reformer skeleton, imported lazily)
        except ImportError as exc:
            return (
                f"the Reformer model is not importable here ({exc}); "
                "model cases need attention_zoo.model"
            )
    try:
        return case.unsupported()
    except Exception as exc:
        return describe_error(exc)


def _measure(runnable: Runnable, settings: MeasureSettings) -> list[Metric]:
    case, step = runnable.case, runnable.step
    on_cuda = torch.device(case.device).type == "cuda"
    rows: list[Metric] = []
    resident = runnable.resident_bytes()
    if "memory" in settings.metrics:
        rows.append(Metric("resident_bytes", resident, "bytes"))
        if on_cuda:
            _, peak = cuda_peak(step, case.device)
            rows += [
                Metric("peak_bytes", peak.peak_bytes, "bytes"),
                Metric("peak_total_bytes", peak.total_peak_bytes, "bytes"),
            ]
        else:
            _, peak = profiled_peak(step)
            rows += [
                Metric("peak_bytes", peak.peak_bytes, "bytes"),
                Metric("peak_total_bytes", resident + peak.peak_bytes, "bytes"),
            ]
    if "crosscheck" in settings.metrics:
        _, tracked = tracked_peak(step)
        rows.append(Metric("tracked_peak_bytes", tracked.peak_bytes, "bytes"))
        if not on_cuda and rss_supported():
            _, rss = rss_peak(step)
            rows.append(Metric("rss_peak_bytes", rss.peak_bytes, "bytes"))
    if "time" in settings.metrics:
        stats = time_call(
            step,
            device=case.device,
            warmup=max(0, settings.warmup - 1),  # one warm-up already ran
            budget_s=settings.time_budget_s,
            min_repeats=settings.min_repeats,
            max_repeats=settings.max_repeats,
        )
        rows += [
            Metric("time_median", stats.median, "s"),
            Metric("time_iqr", stats.iqr, "s"),
            Metric("time_min", stats.min, "s"),
            Metric("time_repeats", stats.repeats, "count"),
        ]
    return rows
