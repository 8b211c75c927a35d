"""Sweeps: a grid (backends x lengths x batches x options x modes ...) expanded into cases, measured
one by one into the results store, crash-safe and resumable.

Each case is committed to the store as soon as it is measured, so an interrupted sweep loses at
most the case in flight; re-running with `resume=True` (or the same run id) measures only the
cases the store lacks. A case that fails is stored with status `error` and its message, an
out-of-memory case with status `oom` (CPU: a case predicted to exceed the memory limit is not run
at all; in a subprocess an address-space limit turns a runaway allocation into an error), and the
sweep goes on.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
from collections.abc import Callable, Iterable, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

from .attention.spec import get_backend, list_backends
from .errors import ConfigError
from .executors import Executor, Job, LocalExecutor, Outcome
from .executors.progress import CaseProgress
from .measure.cases import MODES, TARGETS, BenchCase
from .measure.env import capture
from .measure.runner import DEFAULT_SETTINGS, CaseResult, MeasureSettings, measure_case
from .measure.status import ERROR, OOM
from .measure.worker import run_isolated
from .store import ResultStore

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class SweepGrid:
    """The axes of a sweep. Every tuple is an axis; `cases()` takes their product.

    options: backend -> {option: value}; a list value is an axis (e.g. num_hashes = [1, 2, 4]);
    to pass a list-valued option itself (num_buckets = [32, 64]) wrap it: [[32, 64]].
    models: ReformerConfig field dicts for target "model" (each may carry a "label"); a model
    whose dict sets attn_layers ignores the backends axis.
    """

    target: str = "block"
    backends: tuple[str, ...] = ()  # empty: every registered backend
    seq_lens: tuple[int, ...] = (1024,)
    batches: tuple[int, ...] = (1,)
    modes: tuple[str, ...] = ("forward",)
    dtypes: tuple[str, ...] = ("float32",)
    causal: tuple[bool, ...] = (True,)
    devices: tuple[str, ...] = ("cpu",)
    num_heads: int = 4
    head_dim: int = 64
    hidden: int = 256
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    models: tuple[dict[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ConfigError(f"target {self.target!r} is not one of: {', '.join(TARGETS)}")
        bad = [m for m in self.modes if m not in MODES]
        if bad:
            raise ConfigError(f"mode(s) {bad} unknown; modes: {', '.join(MODES)}")
        for name in ("seq_lens", "batches", "modes", "dtypes", "causal", "devices"):
            if not getattr(self, name):
                raise ConfigError(f"grid axis {name!r} is empty; give at least one value")

    def backend_names(self) -> list[str]:
        names = list(self.backends) or [s.name for s in list_backends()]
        for name in names:
            get_backend(name)  # UnknownNameError lists the registered backends
        return names

    def cases(self) -> list[BenchCase]:
        """Every case of the grid, validated (unknown backends/options raise before any run)."""
        for backend in self.options:
            get_backend(backend)
        devices = [_resolve_device(d) for d in self.devices]
        variants = self._variants()
        out: list[BenchCase] = []
        for (
            backend,
            options,
            model,
            label,
        ), n, b, mode, dtype, causal, device in itertools.product(
            variants, self.seq_lens, self.batches, self.modes, self.dtypes, self.causal, devices
        ):
            out.append(
                BenchCase(
                    target=self.target,
                    backend=backend,
                    seq_len=n,
                    batch=b,
                    num_heads=self.num_heads,
                    head_dim=self.head_dim,
                    hidden=self.hidden,
                    causal=causal,
                    dtype=dtype,
                    device=device,
                    mode=mode,
                    options=options,
                    model=model,
                    label=label,
                )
            )
        return list({c.key(): c for c in out}.values())  # duplicates collapse (same key)

    def _variants(self) -> list[tuple[str, dict[str, Any], dict[str, Any], str]]:
        if self.target != "model" or not self.models:
            models: Sequence[dict[str, Any]] = [{}]
        else:
            models = self.models
        out = []
        for model in models:
            model = dict(model)
            label = str(model.pop("label", ""))
            if "attn_layers" in model:
                layers = model["attn_layers"]
                layers = [layers] if isinstance(layers, str) else list(layers)
                for name in layers:
                    get_backend(name)
                out.append(("+".join(layers), {}, model, label))
                continue
            for backend in self.backend_names():
                for options in expand_options(backend, self.options.get(backend, {})):
                    out.append((backend, options, model, label))
        return out


def expand_options(backend: str, options: dict[str, Any]) -> list[dict[str, Any]]:
    """The product of list-valued options; each combination checked against the backend."""
    spec = get_backend(backend)
    keys = list(options)
    axes = [v if isinstance(v, list) else [v] for v in options.values()]
    combos = [dict(zip(keys, values)) for values in itertools.product(*axes)]
    for combo in combos:
        spec.make_config(**combo)  # OptionError names the options the backend takes
    return combos


def _resolve_device(device: str) -> str:
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def sweep_fingerprint(cases: Iterable[BenchCase]) -> str:
    """Identity of a case list (order-independent): resume looks runs up by it."""
    keys = sorted(c.key() for c in cases)
    return hashlib.sha1("\n".join(keys).encode()).hexdigest()[:16]


def available_memory_bytes() -> int | None:
    """MemAvailable from /proc/meminfo, or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def default_memory_limit() -> int | None:
    """90% of the memory available now: the CPU guard's default."""
    avail = available_memory_bytes()
    return int(avail * 0.9) if avail else None


@dataclass
class SweepResult:
    run_id: str
    results: list[CaseResult]  # the cases measured now
    already_done: int  # cases found in the store and skipped (resume)
    total: int

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            out[r.status] = out.get(r.status, 0) + 1
        return out


Measure = Callable[[BenchCase, MeasureSettings], CaseResult]
AUTO = "auto"  # memory limit: 90% of the memory available where the case runs, when it starts


def measure_one(
    case: BenchCase,
    settings: MeasureSettings = DEFAULT_SETTINGS,
    *,
    isolate: bool = False,
    memory_limit_bytes: int | str | None = None,
    timeout_s: float | None = None,
    measure: Measure | None = None,
) -> CaseResult:
    """Measure one case in the process that runs it (the driver or a Ray worker): the one method
    every executor uses, so local and remote numbers are taken the same way.

    memory_limit_bytes guards CPU cases by their prediction (and is the subprocess's address-space
    limit with isolate); AUTO resolves it here, from this machine's available memory.
    """
    cpu = case.device == "cpu"
    limit = default_memory_limit() if memory_limit_bytes == AUTO else memory_limit_bytes
    if cpu and limit is not None:
        settings = _with_limit(settings, int(limit))
    if measure is not None:
        return _guarded(measure, case, settings)
    if isolate:
        return run_isolated(
            case, settings, rlimit_bytes=int(limit) if cpu and limit else None, timeout_s=timeout_s
        )
    return measure_case(case, settings)


def case_job(
    case: BenchCase,
    settings: MeasureSettings,
    *,
    isolate: bool = False,
    memory_limit_bytes: int | str | None = None,
    timeout_s: float | None = None,
    measure: Measure | None = None,
) -> Job:
    """The executor job measuring `case` with measure_one."""
    return Job(
        key=case.key(),
        label=case.name(),
        fn=measure_one,
        args=(case, settings),
        kwargs={
            "isolate": isolate,
            "memory_limit_bytes": memory_limit_bytes,
            "timeout_s": timeout_s,
            "measure": measure,
        },
        device=case.device,
        threads=settings.threads,
    )


def run_sweep(
    cases: Sequence[BenchCase],
    store: ResultStore,
    *,
    settings: MeasureSettings = DEFAULT_SETTINGS,
    run_id: str | None = None,
    resume: bool = False,
    isolate: bool = False,
    memory_limit_bytes: int | str | None = None,
    timeout_s: float | None = None,
    progress: bool = True,
    measure: Measure | None = None,
    meta: dict[str, Any] | None = None,
    executor: Executor | None = None,
) -> SweepResult:
    """Measure `cases` into `store`, one committed case at a time; returns what ran now.

    run_id: continue that run (its stored cases are skipped) or name a new one. resume: continue
    the latest run of the same case list. isolate: each case in its own subprocess, under an
    address-space limit of memory_limit_bytes. memory_limit_bytes also guards CPU cases by their
    prediction (AUTO: from the memory available where each case runs). measure: replaces
    measure_case (tests inject failures through it). executor: where the cases run (default:
    this process; the caller closes it, `with executor:`); whichever it is, only this process
    writes the store, case by case as each finishes.
    """
    if not cases:
        raise ConfigError("the sweep has no cases; check the grid's axes")
    executor = executor or LocalExecutor()
    jobs = {
        c.key(): case_job(
            c,
            settings,
            isolate=isolate,
            memory_limit_bytes=memory_limit_bytes,
            timeout_s=timeout_s,
            measure=measure,
        )
        for c in cases
    }
    by_key = {c.key(): c for c in cases}
    executor.prepare(list(jobs.values()))  # a bad cluster fails here, before the store is touched
    fingerprint = sweep_fingerprint(cases)
    if run_id is None and resume:
        run_id = store.latest_run(kind="bench", fingerprint=fingerprint)
        if run_id:
            log.info("resuming run %s", run_id)
    run_id = store.start_run(
        kind="bench",
        run_id=run_id,
        fingerprint=fingerprint,
        device=cases[0].device,
        environment=capture(cases[0].device, settings.threads),
        meta={
            "settings": _settings_meta(settings),
            "isolate": isolate,
            "memory_limit_bytes": memory_limit_bytes,
            "executor": executor.name,
            **(meta or {}),
        },
    )
    done = store.completed_cases(run_id)
    todo = [jobs[c.key()] for c in cases if c.key() not in done]
    bar = CaseProgress(len(cases), len(cases) - len(todo), desc="bench", enabled=progress)
    results: list[CaseResult] = []
    try:
        with closing(executor.run(todo, on_start=bar.started)) as outcomes:
            for outcome in outcomes:  # in the order they finish
                case = by_key[outcome.key]
                result = _case_result(case, outcome)
                store.add_rows(
                    run_id,
                    outcome.key,
                    case.to_dict(),
                    result.rows,
                    status=result.status,
                    error=result.error,
                    environment=outcome.environment,
                )
                results.append(result)
                if result.status in (ERROR, OOM):
                    log.warning("%s: %s: %s", case.name(), result.status, result.error)
                bar.finished(result.status, case.name())
    finally:
        bar.close()
    if len(store.completed_cases(run_id) & {c.key() for c in cases}) == len(cases):
        store.finish_run(run_id)
    return SweepResult(
        run_id=run_id, results=results, already_done=len(cases) - len(todo), total=len(cases)
    )


def _case_result(case: BenchCase, outcome: Outcome) -> CaseResult:
    """A job's outcome as a case result: a job that failed outside measure_case (its worker died)
    is an error, or oom when it ran out of memory."""
    if outcome.ok:
        return outcome.value
    return CaseResult(case=case, status=OOM if outcome.oom else ERROR, error=outcome.error)


def _guarded(measure: Measure, case: BenchCase, settings: MeasureSettings) -> CaseResult:
    """An injected measure function that raises still yields a stored error, like measure_case."""
    from .measure.runner import describe_error, is_oom

    try:
        return measure(case, settings)
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        return CaseResult(
            case=case, status=OOM if is_oom(exc) else ERROR, error=describe_error(exc)
        )


def _with_limit(settings: MeasureSettings, limit: int) -> MeasureSettings:
    from dataclasses import replace

    return replace(settings, memory_limit_bytes=limit)


def _settings_meta(settings: MeasureSettings) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(settings)
