"""Measure one case: prediction and FLOPs (shapes only), measured memory, cross-checks, time.
The output is checked before anything is measured (validate.py: a broken one is `invalid`), and a
group whose repeats disagree is timed again, all of it; its spread and the free cores are stored,
from which trust.py marks a time unstable or busy.

One stored row per metric of measure/metrics.py (absent when not measured). Memory notes:
peak_bytes is the measured peak above resident (CPU torch.profiler, CUDA allocator peak stats);
tracked_peak_bytes misses kernel scratch and autograd accumulates out of place under it (so it
can read high); rss_peak_bytes is off either way (malloc caching).
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import math
import re
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..attention.spec import BACKENDS
from ..declarative import check_count, check_field_types
from ..errors import ConfigError, ZooError
from .capture import (
    AUTO,
    CAPTURE_CALLS,
    OFF,
    ON,
    Capture,
    CapturedStep,
    GraphPool,
    captured_step,
    check_cuda_graphs,
    choose_capture,
    graph_pool,
    graphs_apply,
)
from .cases import BenchCase, Runnable, build_runnable
from .duration import (
    LONG_CASE_S,
    CaseTimedOut,
    Expected,
    WatchedStep,
    expected_duration,
    over_limit,
    past_timeout,
)
from .fair import fair_rows
from .fidelity import measure_fidelity
from .kernels import kernel_names
from .memory import cuda_peak, profiled_peak, rss_peak, rss_taken
from .metrics import MEASURE_GROUPS, Metric, metric_row
from .predict import BeyondAnyMemory, Prediction, predict_case
from .status import ERROR, INVALID, OK, OOM, SKIPPED, TIMEOUT
from .timing import CLOCKS, CPU_CLOCK, WALL, fixed_threads
from .tracker import tracked_peak
from .trust import CPU_TIMED, time_until_stable
from .validate import check_case

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class MeasureSettings:
    """How to measure; stored with the run, not part of a case's identity."""

    time_budget_s: float = 1.0  # keep timing until this much time is spent...
    warmup: int = 1  # ...after this many untimed calls
    min_repeats: int = 3
    max_repeats: int = 100
    threads: int | None = None  # torch threads while measuring; None: leave as is
    metrics: tuple[str, ...] = MEASURE_GROUPS  # which groups to measure
    memory_limit_bytes: int | None = None  # don't run a case predicted to need more (status oom)
    # time the cases that differ only in backend/options round-robin (their ratios are the result)
    interleave: bool = False
    # don't run a case predicted (FLOPs at this machine's rate) to take longer (status timeout)
    time_limit_s: float | None = None
    timeout_s: float | None = None  # stop a case after the step that crosses it (status timeout)
    # a CPU step timed by the wall clock, or by the process's CPU time at one thread ("cpu"):
    # what the step costs, which other processes on the machine cannot inflate
    clock: str = WALL
    # a CUDA step replayed from a CUDA graph (capture.py): auto where the case can be, on, off
    cuda_graphs: str = AUTO

    def __post_init__(self) -> None:
        self._check_counts()
        check_cuda_graphs(self.cuda_graphs)
        if self.clock not in CLOCKS:
            raise ConfigError(f"clock {self.clock!r} is not one of: {', '.join(CLOCKS)}")
        if self.clock == CPU_CLOCK and self.threads != 1:
            raise ConfigError(
                f"clock 'cpu' times one thread's work, so it needs threads = 1 (got "
                f"{self.threads}); time more threads with the wall clock"
            )
        unknown = sorted(set(self.metrics) - set(MEASURE_GROUPS))
        if unknown:
            raise ValueError(
                f"unknown metric group(s) {unknown}; known: {', '.join(MEASURE_GROUPS)}"
            )

    def _check_counts(self) -> None:
        """ConfigError, one line, for a count, a time or a value of the wrong kind that a run
        could not use (a preset's `threads = -2` or `time_budget_s = "x"`): refused here, before
        any case runs."""
        check_count(self.warmup, "warmup", minimum=0)
        check_count(self.min_repeats, "min_repeats")
        check_count(self.max_repeats, "max_repeats")
        if self.min_repeats > self.max_repeats:
            raise ConfigError(
                f"min_repeats ({self.min_repeats}) is more than max_repeats "
                f"({self.max_repeats}); raise max_repeats or lower min_repeats"
            )
        if self.threads is not None:
            check_count(self.threads, "threads")
        if self.memory_limit_bytes is not None:
            _check_bytes(self.memory_limit_bytes, "memory_limit_bytes")
        _check_seconds(self.time_budget_s, "time_budget_s", zero=True)
        for name in ("time_limit_s", "timeout_s"):
            if getattr(self, name) is not None:
                _check_seconds(getattr(self, name), name, zero=False)
        check_field_types(self)


def _check_seconds(value: Any, name: str, *, zero: bool) -> None:
    """ConfigError unless `value` is a finite number of seconds, > 0 (or >= 0 with `zero`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{name} must be a number of seconds, got {value!r}")
    if value < 0 or (value == 0 and not zero):
        least = ">=" if zero else ">"
        raise ConfigError(f"{name} must be a number of seconds {least} 0, got {value!r}")


def _check_bytes(value: Any, name: str) -> None:
    """ConfigError unless `value` is a whole number of bytes > 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a whole number of bytes > 0, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class CaseResult:
    """The outcome of one case: status, metric rows (maybe partial), error text, and what it ran
    as (`facts`, stored with its rows: "capabilities" by backend, see case_facts, "kernels":
    the implementation each backend's cores ran, see measure.kernels, and on CUDA "cuda_graphs":
    whether its timed step was a graph's replay, see measure.capture)."""

    case: BenchCase
    status: str  # ok, oom, error, skipped, invalid
    rows: list[Metric] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0
    facts: dict[str, Any] = field(default_factory=dict)

    def value(self, metric: str) -> float | None:
        return next((r.value for r in self.rows if r.metric == metric), None)


def case_facts(case: BenchCase) -> dict[str, Any]:
    """What `case` runs as, from the registry now: {"capabilities": {backend: caps dict}} for each
    registered backend it uses (with the case's options when it uses one), so a report can rank
    it without the plugin that registered it."""
    names = case.backends()
    capabilities = {}
    for name in names:
        if name not in BACKENDS:  # a peer: its mirrored backend's kind is known without plugins
            continue
        spec = BACKENDS.get(name)
        try:
            caps = spec.caps_for(**case.options) if len(names) == 1 else spec.caps
        except (ZooError, TypeError):  # options it does not take: the case fails on its own
            caps = spec.caps
        capabilities[name] = caps.to_dict()
    return {"capabilities": capabilities} if capabilities else {}


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
    """'Type: message (at file:line)' — enough to find it, short enough for a table; an object's
    default repr (`<pkg.Name object at 0x...>`) in the message is shown as its class name."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    text = _OBJECT_REPR.sub(lambda m: m.group(1).rsplit(".", 1)[-1], str(exc))
    return f"{type(exc).__name__}: {text}{where}"


_OBJECT_REPR = re.compile(r"<([\w.<>]+) object at 0x[0-9a-fA-F]+>")


def prediction_rows(p: Prediction) -> list[Metric]:
    return [
        metric_row("predicted_peak_bytes", p.peak_bytes),
        metric_row("predicted_resident_bytes", p.resident_bytes),
        metric_row("predicted_total_bytes", p.total_bytes),
    ]


DEFAULT_SETTINGS = MeasureSettings()


def measure_case(
    case: BenchCase,
    settings: MeasureSettings = DEFAULT_SETTINGS,
    predicted: Mapping[str, Prediction] | None = None,
) -> CaseResult:
    """Measure `case`; a failing case is a status (error/oom), only KeyboardInterrupt raises."""
    return measure_group([case], settings, predicted)[0]


def measure_group(
    cases: Sequence[BenchCase],
    settings: MeasureSettings = DEFAULT_SETTINGS,
    predicted: Mapping[str, Prediction] | None = None,
) -> list[CaseResult]:
    """Measure cases that are compared with each other (same device): each is predicted, built and
    its memory measured in turn, then all are timed round-robin (a, b, c, a, b, c, ...) so that a
    change in the machine's load hits them alike. One case alone is timed exactly as before.
    predicted: predictions made before the run (zoo bench's time check) by case key, not made
    again."""
    known = predicted or {}
    with fixed_threads(settings.threads):
        pending = [_Pending(case, known.get(case.key())) for case in cases]
        try:
            for i, p in enumerate(pending):
                alone = not any(q.runnable is not None for q in pending[:i])
                p.prepare(settings, alone=alone)
            live = [p for p in pending if p.runnable is not None]
            if live and "time" in settings.metrics:
                _capture_group(live, settings)
                live = [p for p in live if p.runnable is not None]
                if live:
                    _time_round_robin(live, settings)
            for p in live:
                if p.result is None:  # not failed while timed (fail() stored its status)
                    p.finish(OK)
        finally:
            for p in pending:  # its tensors and graphs freed, for the cache to be emptied
                p.runnable = p.plain = p.replay = None
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return [p.result for p in pending if p.result is not None]


class _Pending:
    """One case of a group on its way to a CaseResult."""

    def __init__(self, case: BenchCase, predicted: Prediction | None = None) -> None:
        self.case, self.start = case, time.perf_counter()
        self.predicted = predicted  # made before the run: not made again
        self.rows: list[Metric] = []
        self.notes: list[str] = []
        self.runnable: Runnable | None = None
        self.result: CaseResult | None = None
        self.kernels: dict[str, str] = {}  # the implementation each backend's cores run
        self.expected: Expected | None = None  # its predicted duration, where a limit asked
        self.capture: Capture | None = None  # whether its timed step is a graph's replay
        self.plain: Runnable | None = None  # the runnable with its (watched) step, uncaptured
        self.replay: CapturedStep | None = None  # its captured step, once captured

    def finish(self, status: str, error: str | None = None) -> None:
        text = "; ".join(([error] if error else []) + self.notes) or None
        self.result = CaseResult(
            case=self.case,
            status=status,
            rows=self.rows,
            error=text,
            seconds=time.perf_counter() - self.start,
            facts={
                **case_facts(self.case),
                **({"kernels": self.kernels} if self.kernels else {}),
                **({"cuda_graphs": self.capture.fact()} if self._graphs_told() else {}),
            },
        )
        self.runnable = None

    def _graphs_told(self) -> bool:
        """Whether the case's facts say if it was captured: where graphs apply (CUDA)."""
        return self.capture is not None and self.capture.told

    def fail(self, exc: Exception) -> None:
        log.debug("case %s failed", self.case.name(), exc_info=True)
        if isinstance(exc, CaseTimedOut):
            return self.finish(TIMEOUT, str(exc))
        self.finish(OOM if is_oom(exc) else ERROR, describe_error(exc))

    def prepare(self, settings: MeasureSettings, *, alone: bool = True) -> None:
        """Prediction, memory guard, build, warm-up and memory metrics; finishes the case unless
        it is left to be timed (then `runnable` is set)."""
        self.start = time.perf_counter()
        case = self.case
        if reason := unsupported_here(case):
            return self.finish(SKIPPED, reason)
        limits = (settings.memory_limit_bytes, settings.time_limit_s, settings.timeout_s)
        limited = any(x is not None for x in limits)
        wanted = limited or not {"predict", "flops"}.isdisjoint(settings.metrics)
        prediction = self.predicted if wanted else None
        if prediction is None and wanted:
            try:
                prediction = predict_case(case)
            except BeyondAnyMemory as exc:
                return self.finish(OOM, f"not run: {exc}")
            except Exception as exc:
                self.notes.append(f"prediction failed: {describe_error(exc)}")
        if prediction is not None:
            if "predict" in settings.metrics:
                self.rows.extend(prediction_rows(prediction))
            if "flops" in settings.metrics:
                self.rows.append(metric_row("flops", prediction.flops))
            limit = settings.memory_limit_bytes
            if limit is not None and prediction.total_bytes > limit:
                return self.finish(
                    OOM,
                    f"not run: predicted {prediction.total_bytes / 2**20:.1f} MiB > memory limit "
                    f"{limit / 2**20:.1f} MiB",
                )
            if refused := self.expect(settings, prediction.flops):
                return self.finish(TIMEOUT, refused)
            self.rows += fair_rows(case, settings.metrics)  # another prediction: not when refused
        if "fidelity" in settings.metrics:
            fidelity = measure_fidelity(case, settings.memory_limit_bytes)
            self.rows += fidelity.rows
            self.notes += [fidelity.note] if fidelity.note else []
            if (over := past_timeout(self.start, settings.timeout_s, "its fidelity")) is not None:
                return self.finish(TIMEOUT, over)
        if not {"time", "memory", "crosscheck"} & set(settings.metrics):
            return self.finish(OK)
        try:
            runnable = build_runnable(case)
            self.kernels = kernel_names(case, runnable.module)
            runnable.step = self.watched(runnable.step, settings)
            invalid, note = check_case(runnable)  # one forward on the case's own inputs
            self.notes += [note] if note else []
            if invalid:
                return self.finish(INVALID, invalid)
            if case.mode != "forward":  # a forward's warm-up is the check's forward
                runnable.step()  # warm-up: lazy state (optimizer moments, caches) becomes resident
            self.rows.extend(_measure_memory(runnable, settings, alone=alone))
            if "time" in settings.metrics:
                self.plain = dataclasses.replace(runnable)  # its step, kept if it is captured
                self.capture = choose_capture(self.plain, settings.cuda_graphs)
        except Exception as exc:  # any failure is a stored result, never a crash
            return self.fail(exc)
        if "time" in settings.metrics:
            self.runnable = runnable
        else:
            self.finish(OK)

    def capture_into(self, settings: MeasureSettings, pool: GraphPool | None) -> None:
        """Its timed step becomes a CUDA graph's replay (watched, as the step was); the capture's
        own calls run the watched step. Raises what the capture raised."""
        assert self.plain is not None and self.runnable is not None
        self.replay = captured_step(self.plain, pool)
        self.runnable.step = self.watched(self.replay, settings, announce=False)

    def uncapture(self) -> None:
        """Its timed step back to the plain one, as it ran before a capture."""
        if self.replay is not None:
            self.replay.restore()
            self.replay = None
        if self.runnable is not None and self.plain is not None:
            self.runnable.step = self.plain.step  # the watched step it had

    def expect(self, settings: MeasureSettings, flops: float) -> str | None:
        """Predict the case's duration where a limit asks for it; why it is not run when the
        prediction is past the time limit (or past --timeout: it would be stopped anyway)."""
        if settings.time_limit_s is None and settings.timeout_s is None:
            return None
        graphs = graphs_apply(self.case.device) and settings.cuda_graphs != OFF
        capture = CAPTURE_CALLS if graphs else 0
        self.expected = expected_duration(
            self.case,
            flops,
            settings.metrics,
            warmup=settings.warmup + capture,
            min_repeats=settings.min_repeats,
        )
        return over_limit(self.expected, settings.time_limit_s, settings.timeout_s)

    def watched(
        self, step: Callable[[], None], settings: MeasureSettings, *, announce: bool = True
    ) -> Callable[[], None]:
        """The case's step, watched for progress (an expected long case) and --timeout; announce:
        say once that it is expected to be long (not again for the replay that replaces it)."""
        long = self.expected if self.expected and self.expected.seconds >= LONG_CASE_S else None
        if long is None and settings.timeout_s is None:
            return step
        if long is not None and announce:
            log.warning("%s: expected to take %s", self.case.name(), long.describe())
        return WatchedStep(
            step, self.case.name(), start=self.start, expected=long, timeout_s=settings.timeout_s
        )


def _capture_group(live: list[_Pending], settings: MeasureSettings) -> None:
    """Every live case's step replayed from a CUDA graph, or none (their times are compared,
    so they are taken alike): under auto, one that cannot be captured, or whose capture fails,
    leaves the others timed as they are; under on, a failed capture fails its own case."""
    blocked = next((p for p in live if p.capture is None or not p.capture.on), None)
    if blocked is not None:
        for p in live:
            if p.capture is not None and p.capture.on:
                p.capture = Capture(
                    False, f"timed as it is, as {_group_reason(blocked)}", p.capture.told
                )
        return
    pool = graph_pool(live[0].case.device)  # one pool and capture stream for the group
    for p in live:
        try:
            p.capture_into(settings, pool)
        except Exception as exc:
            told = p.capture.told if p.capture is not None else True
            p.capture = Capture(False, f"capture failed: {type(exc).__name__}: {exc}", told)
            if isinstance(exc, CaseTimedOut) or settings.cuda_graphs == ON:
                p.fail(exc)
                continue
            for q in live:
                if q.runnable is None or q.plain is None:  # failed before: nothing to time
                    continue
                q.uncapture()
                if q is not p and q.capture is not None:
                    q.capture = Capture(
                        False, f"timed as it is, as {_group_reason(p)}", q.capture.told
                    )
            return


def _group_reason(blocked: _Pending) -> str:
    """Why the cases of a group are not captured: the one that is not, and why."""
    why = blocked.capture.why if blocked.capture is not None else "it is not timed"
    return f"{blocked.case.backend} in its group is not ({why})"


def _time_round_robin(live: list[_Pending], settings: MeasureSettings) -> None:
    """Time every live case's step interleaved; a case whose step fails leaves the rotation."""
    failed: dict[int, Exception] = {}

    def guarded(i: int, step: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            if i in failed:
                return
            try:
                step()
            except Exception as exc:
                failed[i] = exc

        return run

    fns = {i: guarded(i, p.runnable.step) for i, p in enumerate(live) if p.runnable is not None}
    cpu_timed = settings.clock == CPU_CLOCK and live[0].case.device == "cpu"
    timed = time_until_stable(
        fns,
        device=live[0].case.device,
        warmup=max(0, settings.warmup - 1),  # one warm-up already ran
        repeats=settings.min_repeats,
        budget_s=settings.time_budget_s,
        max_repeats=settings.max_repeats,
        dropped=failed.__contains__,
        clock=CPU_CLOCK if cpu_timed else WALL,
    )
    for i, p in enumerate(live):
        if i in failed:
            p.fail(failed[i])
            continue
        t = timed[i]
        rows = [
            metric_row("time_median", t.stats.median),
            metric_row("time_iqr", t.stats.iqr),
            metric_row("time_min", t.stats.min),
            metric_row("time_repeats", t.stats.repeats),
            metric_row("time_attempts", t.attempts),
        ]
        if t.free_cores is not None:
            rows.append(metric_row("free_cores", t.free_cores))
        if cpu_timed:
            rows.append(metric_row(CPU_TIMED, 1.0))
        p.rows += rows  # its marks follow from these rows (trust.timing_marks)


def unsupported_here(case: BenchCase) -> str | None:
    """Why `case` cannot run on this machine (its device, dtype, causality, decoding), or None:
    the case is then stored as skipped with this reason."""
    if torch.device(case.device).type == "cuda" and not torch.cuda.is_available():
        return (
            "no CUDA device is visible here (predict CUDA memory with 'zoo memory --devices cuda')"
        )
    try:
        return case.unsupported()
    except Exception as exc:
        return describe_error(exc)


def _measure_memory(
    runnable: Runnable, settings: MeasureSettings, *, alone: bool = True
) -> list[Metric]:
    """Measured and cross-check memory of one step (the case has been warmed up)."""
    case, step = runnable.case, runnable.step
    on_cuda = torch.device(case.device).type == "cuda"
    rows: list[Metric] = []
    resident = runnable.resident_bytes()
    if "memory" in settings.metrics:
        rows.append(metric_row("resident_bytes", resident))
        if on_cuda:
            _, peak = cuda_peak(step, case.device)
            # The allocator's total counts every tensor alive, those of the other cases of a group
            # too: then this case's own resident bytes stand for its part.
            total = peak.total_peak_bytes if alone else resident + peak.peak_bytes
            rows += [
                metric_row("peak_bytes", peak.peak_bytes),
                metric_row("peak_total_bytes", total),
            ]
        else:
            _, peak = profiled_peak(step)
            rows += [
                metric_row("peak_bytes", peak.peak_bytes),
                metric_row("peak_total_bytes", resident + peak.peak_bytes),
            ]
        if runnable.state is not None:  # a decoding state's bytes, per sequence
            rows.append(metric_row("state_bytes", runnable.state().nbytes() / case.batch))
    if "crosscheck" in settings.metrics:
        _, tracked = tracked_peak(step)
        rows.append(metric_row("tracked_peak_bytes", tracked.peak_bytes))
        if rss_taken(case.device, settings.metrics):  # not in the baseline's runs: a step saved
            _, rss = rss_peak(step)
            rows.append(metric_row("rss_peak_bytes", rss.peak_bytes))
    return rows
