"""Sweeps: a grid (backends x lengths x batches x options x modes ...) expanded into cases, measured
one by one into the results store by the run engine (engine.run_plan), crash-safe and resumable.

Each case is committed to the store as soon as it is measured, so an interrupted sweep loses at
most the case in flight; re-running with `resume=True` (or the same run id) measures only the
cases the store lacks (engine.RUN_RULE). A case that fails is stored with status `error` and its
message, an out-of-memory case with status `oom` (CPU: a case predicted to exceed the memory limit
is not run at all; in a subprocess an address-space limit turns a runaway allocation into an
error), and the sweep goes on.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from .attention.spec import get_backend, list_backends
from .declarative import check_count, check_field_types
from .engine import Plan, RunPolicy, Stored, failed_status, fingerprint, run_plan
from .errors import ConfigError
from .executors import Executor, Job, Outcome
from .measure.cases import DECODE_MODES, DECODERS, MODES, TARGETS, BenchCase, comparison_key
from .measure.env import Environment, capture
from .measure.limits import auto_memory_limit
from .measure.load import Load
from .measure.peers import get_peer, is_peer, select_peers
from .measure.predict import Prediction
from .measure.runner import (
    DEFAULT_SETTINGS,
    CaseResult,
    MeasureSettings,
    case_facts,
    describe_error,
    is_oom,
    measure_case,
    measure_group,
)
from .measure.status import ERROR, INVALID, OOM, TIMEOUT
from .measure.trust import timing_marks
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
    peers: peer families ("hf", "lucid") or peer names ("hf:lsh") measured beside the backends;
    a family brings the peers of the backends measured. A peer without options of its own takes
    those of the backend it mirrors, so both sides run with the same settings.
    Modes prefill and decode measure the attention cores' decoding states (target attention,
    causal, whatever `target` and `causal` say): new_tokens after a seq_len prompt, decoded by
    each of `decoders` (own: the backend's decoding; recompute: the whole prefix every token).
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
    peers: tuple[str, ...] = ()
    new_tokens: int = 64  # prefill/decode: tokens generated after the prompt
    decoders: tuple[str, ...] = ("own",)  # prefill/decode: own, recompute

    def __post_init__(self) -> None:
        self._check_types()  # before any check that computes with the values
        if self.target not in TARGETS:
            raise ConfigError(f"target {self.target!r} is not one of: {', '.join(TARGETS)}")
        bad = [m for m in self.modes if m not in MODES]
        if bad:
            raise ConfigError(f"mode(s) {bad} unknown; modes: {', '.join(MODES)}")
        for name in ("seq_lens", "batches", "modes", "dtypes", "causal", "devices", "decoders"):
            if not getattr(self, name):
                raise ConfigError(f"grid axis {name!r} is empty; give at least one value")
        if bad := [d for d in self.decoders if d not in DECODERS]:
            raise ConfigError(f"decoder(s) {bad} unknown; decoders: {', '.join(DECODERS)}")
        if set(self.modes) & set(DECODE_MODES) and self.target == "model":
            raise ConfigError(
                "modes prefill and decode measure attention cores' decoding states; a model "
                "generates with ReformerLM.generate: use target attention (or block)"
            )

    def _check_types(self) -> None:
        """ConfigError for a value of the wrong kind (a preset's `num_heads = "four"`); counts in
        the words BenchCase uses for one value, so a grid and a case say the same."""
        for name in ("num_heads", "head_dim", "hidden"):
            check_count(getattr(self, name), name)
        check_count(self.new_tokens, "new_tokens", minimum=0)
        check_field_types(self)
        for name in ("seq_lens", "batches"):
            for value in getattr(self, name):
                check_count(value, name)

    def backend_names(self) -> list[str]:
        """Our backends (every registered one when none is given), then the peers."""
        names = list(self.backends) or [s.name for s in list_backends()]
        for name in names:
            if not is_peer(name):
                get_backend(name)  # UnknownNameError lists the registered backends
        return list(dict.fromkeys(names + select_peers(self.peers, names)))

    def cases(self) -> list[BenchCase]:
        """Every case of the grid, validated (unknown backends/options raise before any run)."""
        for backend in self.options:
            if not is_peer(backend):
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
            common = dict(
                backend=backend,
                seq_len=n,
                batch=b,
                num_heads=self.num_heads,
                head_dim=self.head_dim,
                hidden=self.hidden,
                dtype=dtype,
                device=device,
                mode=mode,
                options=options,
                model=model,
            )
            if mode not in DECODE_MODES:
                out.append(BenchCase(target=self.target, causal=causal, label=label, **common))
                continue
            # a core decodes causally, whatever the axis says; a prefill is the forward either way
            for decoder in self.decoders if mode == "decode" else ("own",):
                named = label or (f"{backend} (recompute)" if decoder == "recompute" else "")
                out.append(
                    BenchCase(
                        target="attention",
                        causal=True,
                        label=named,
                        new_tokens=self.new_tokens,
                        decoder=decoder,
                        **common,
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
                for options in self._options_of(backend):
                    if not is_peer(backend):  # shared KV heads must divide the query heads
                        heads = model.get("num_attention_heads", self.num_heads)
                        try:
                            get_backend(backend).layout(**options).kv_heads_for(heads)
                        except ConfigError as e:
                            raise ConfigError(f"{backend}: {e}") from None
                    out.append((backend, options, model, label))
        return out

    def _options_of(self, backend: str) -> list[dict[str, Any]]:
        if is_peer(backend) and backend not in self.options:
            spec = get_peer(backend)
            mirrored = expand_options(spec.mirrors, self.options.get(spec.mirrors, {}))
            inherited = [spec.inherit(o) for o in mirrored]
            return list({json.dumps(o, sort_keys=True): o for o in inherited}.values())
        return expand_options(backend, self.options.get(backend, {}))


def expand_options(backend: str, options: dict[str, Any]) -> list[dict[str, Any]]:
    """The product of list-valued options; each combination checked against the backend."""
    make = get_peer(backend).make_options if is_peer(backend) else get_backend(backend).make_config
    keys = list(options)
    axes = [v if isinstance(v, list) else [v] for v in options.values()]
    combos = [dict(zip(keys, values)) for values in itertools.product(*axes)]
    for combo in combos:
        make(**combo)  # OptionError names the options the backend takes
    return combos


def _resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def sweep_fingerprint(cases: Iterable[BenchCase]) -> str:
    """Identity of a case list (order-independent): resume looks runs up by it."""
    return fingerprint(c.key() for c in cases)


def default_memory_limit() -> int | None:
    """The CPU guard's default: 90% of the memory this process may still use, the smallest of
    available RAM, RLIMIT_AS and the cgroup limit (measure.limits)."""
    limit = auto_memory_limit()
    return limit.bytes if limit else None


@dataclass
class SweepResult:
    run_id: str | None  # None: a dry run (nothing started)
    results: list[CaseResult]  # the cases measured now
    already_done: int  # cases found in the store and skipped (resume)
    total: int
    load_end: Load | None = None  # the machine's load when the run finished (None: not finished)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            out[r.status] = out.get(r.status, 0) + 1
        return out


Measure = Callable[[BenchCase, MeasureSettings], CaseResult]
AUTO = "auto"  # memory limit: 90% of the memory a case may use where it runs, when it starts


def measure_one(
    case: BenchCase,
    settings: MeasureSettings = DEFAULT_SETTINGS,
    *,
    isolate: bool = False,
    memory_limit_bytes: int | str | None = None,
    timeout_s: float | None = None,
    measure: Measure | None = None,
    predicted: Mapping[str, Prediction] | None = None,
) -> CaseResult:
    """Measure one case in the process that runs it (the driver or a Ray worker): the one method
    every executor uses, so local and remote numbers are taken the same way.

    memory_limit_bytes guards CPU cases by their prediction (and is the subprocess's address-space
    limit with isolate); AUTO resolves it here, from the memory this process may use
    (measure.limits: RAM, RLIMIT_AS, cgroup). predicted: the case's prediction made before the
    run, by its key (measure_group).
    """
    cpu = case.device == "cpu"
    limit = default_memory_limit() if memory_limit_bytes == AUTO else memory_limit_bytes
    if cpu and limit is not None:
        settings = _with_limit(settings, int(limit))
    if measure is not None:
        return _guarded(measure, case, settings)
    if isolate:
        return run_isolated(
            case,
            settings,
            rlimit_bytes=int(limit) if cpu and limit else None,
            timeout_s=timeout_s,
            predicted=(predicted or {}).get(case.key()),
        )
    return measure_case(case, settings, predicted)


def measure_together(
    cases: Sequence[BenchCase],
    settings: MeasureSettings = DEFAULT_SETTINGS,
    *,
    memory_limit_bytes: int | str | None = None,
    predicted: Mapping[str, Prediction] | None = None,
) -> list[CaseResult]:
    """measure_one for cases compared with each other (settings.interleave): measured as one group
    in the process that runs them, their timing round-robin (measure_group)."""
    limit = default_memory_limit() if memory_limit_bytes == AUTO else memory_limit_bytes
    if cases[0].device == "cpu" and limit is not None:
        settings = _with_limit(settings, int(limit))
    return measure_group(cases, settings, predicted)


def _batches(cases: Sequence[BenchCase], *, interleave: bool) -> list[list[BenchCase]]:
    """Cases measured together: with `interleave`, those compared with each other (same shape,
    mode, dtype, device; any backend and options), in order of first appearance; else one each."""
    if not interleave:
        return [[case] for case in cases]
    groups: dict[str, list[BenchCase]] = {}
    for case in cases:
        groups.setdefault(comparison_key(case.to_dict()), []).append(case)
    return list(groups.values())


def batch_job(cases: Sequence[BenchCase], settings: MeasureSettings, **kwargs: Any) -> Job:
    """One case: its case_job; several: one job measuring them together (measure_together)."""
    if len(cases) == 1:
        return case_job(cases[0], settings, **kwargs)
    return Job(
        key=cases[0].key(),
        label=f"{cases[0].name()} (+{len(cases) - 1} interleaved)",
        fn=measure_together,
        args=(tuple(cases), settings),
        kwargs={
            "memory_limit_bytes": kwargs.get("memory_limit_bytes"),
            "predicted": kwargs.get("predicted"),
        },
        device=cases[0].device,
        threads=settings.threads,
    )


def case_job(
    case: BenchCase,
    settings: MeasureSettings,
    *,
    isolate: bool = False,
    memory_limit_bytes: int | str | None = None,
    timeout_s: float | None = None,
    measure: Measure | None = None,
    predicted: Mapping[str, Prediction] | None = None,
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
            "predicted": predicted,
        },
        device=case.device,
        threads=settings.threads,
    )


class BenchPlan(Plan):
    """Bench cases as engine units: one job per case, or per group of cases measured together
    (settings.interleave); each case stored with its metric rows, or its error/oom."""

    kind = "bench"
    desc = "bench"
    reuse_stored = False  # a time belongs to the machine's state now (engine.RUN_RULE)

    def __init__(
        self,
        cases: Sequence[BenchCase],
        settings: MeasureSettings,
        *,
        environment: Environment,
        predicted: Mapping[str, Prediction] | None = None,
        **job_options: Any,
    ) -> None:
        self.cases, self.settings, self.environment = list(cases), settings, environment
        self.predicted = dict(predicted or {})  # made before the run, by case key
        self.names = {c.key(): c.name() for c in self.cases}
        self.job_options = job_options  # case_job's: isolate, memory_limit_bytes, ...
        self.interleave = (
            settings.interleave and not job_options.get("isolate") and not job_options["measure"]
        )
        self.batch_of: dict[str, list[BenchCase]] = {}
        self.results: list[CaseResult] = []  # the cases measured now, in the order they finish

    def keys(self) -> list[str]:
        return [c.key() for c in self.cases]

    def label(self, key: str) -> str:
        return self.names[key]

    def jobs(self, todo: Sequence[str]) -> list[Job]:
        wanted = set(todo)
        batches = _batches([c for c in self.cases if c.key() in wanted], interleave=self.interleave)
        self.batch_of = {b[0].key(): b for b in batches}
        return [
            batch_job(b, self.settings, predicted=self._predicted(b), **self.job_options)
            for b in batches
        ]

    def _predicted(self, batch: Sequence[BenchCase]) -> dict[str, Prediction] | None:
        """The batch's predictions made before the run: each job carries its own only."""
        known = {c.key(): self.predicted[c.key()] for c in batch if c.key() in self.predicted}
        return known or None

    def save(self, store: ResultStore, run_id: str, outcome: Outcome) -> list[Stored]:
        batch = self.batch_of[outcome.key]
        out = []
        for case, result in zip(batch, _case_results(batch, outcome)):
            store.add_rows(
                run_id,
                case.key(),
                case.to_dict(),
                result.rows,
                status=result.status,
                error=result.error,
                environment=outcome.environment,
                facts=result.facts or case_facts(case),  # a job that died returned none
            )
            self.results.append(result)
            if result.status in (ERROR, OOM, INVALID, TIMEOUT):
                log.warning("%s: %s: %s", case.name(), result.status, result.error)
            _warn_marks(case, result, (outcome.environment or self.environment).threads)
            out.append(Stored(case.key(), case.name(), result.status))
        return out


def run_sweep(
    cases: Sequence[BenchCase],
    store: ResultStore,
    *,
    settings: MeasureSettings = DEFAULT_SETTINGS,
    policy: RunPolicy | None = None,
    isolate: bool = False,
    memory_limit_bytes: int | str | None = None,
    timeout_s: float | None = None,
    progress: bool = True,
    measure: Measure | None = None,
    meta: dict[str, Any] | None = None,
    executor: Executor | None = None,
    load_start: Load | None = None,
    predicted: Mapping[str, Prediction] | None = None,
) -> SweepResult:
    """Measure `cases` into `store` through the run engine (engine.run_plan), one committed case
    at a time; returns what ran now.

    policy: engine.RUN_RULE (default: a new run; run_id or resume continue one; force measures
    every case again; dry_run prints the cases that would be measured, nothing else). isolate:
    each case in its own subprocess, under an address-space limit of memory_limit_bytes, which
    also guards CPU cases by their prediction (AUTO: from the memory available where each case
    runs). measure: replaces
    measure_case (tests inject failures through it). executor: where the cases run (default:
    this process; the caller closes it, `with executor:`); whichever it is, only this process
    writes the store, case by case as each finishes. settings.interleave: the cases compared
    with each other (same shape, mode, dtype, device) are one job, measured together and timed
    round-robin (not with isolate or measure: one by one then). load_start: the machine's load
    the caller sampled just before (recorded as the run's start; default: sampled here).
    predicted: predictions the caller made (zoo bench's time check) by case key, not made again.
    """
    if not cases:
        raise ConfigError("the sweep has no cases; check the grid's axes")
    environment = capture(cases[0].device, settings.threads)
    plan = BenchPlan(
        cases,
        settings,
        environment=environment,
        predicted=predicted,
        isolate=isolate,
        memory_limit_bytes=memory_limit_bytes,
        timeout_s=timeout_s,
        measure=measure,
    )
    done = run_plan(
        plan,
        store,
        policy=policy or RunPolicy(),
        executor=executor,
        device=cases[0].device,
        environment=environment,
        meta={
            "settings": _settings_meta(settings),
            "isolate": isolate,
            "memory_limit_bytes": memory_limit_bytes,
            **(meta or {}),
        },
        load_start=load_start,
        progress=progress,
    )
    # a bench plan never reuses earlier runs: a run was started unless this was a dry run
    assert done.run_id is not None or (policy and policy.dry_run)
    return SweepResult(
        run_id=done.run_id,
        results=plan.results,
        already_done=len(done.skipped),
        total=done.total,
        load_end=done.load_end,
    )


def _warn_marks(case: BenchCase, result: CaseResult, threads: int) -> None:
    """One line for a time set aside (unstable, taken on a busy machine, or both), with what was
    seen; threads: those stored with its rows."""
    metrics = {r[0]: r[1] for r in result.rows}
    if marks := timing_marks(metrics, threads=threads, device=case.device):
        log.warning("%s: time marked %s", case.name(), "; ".join(m.reason for m in marks))


def _case_results(batch: Sequence[BenchCase], outcome: Outcome) -> list[CaseResult]:
    """A job's outcome as case results: a job that failed outside measure_case (its worker died)
    is an error for each of its cases, or oom when it ran out of memory."""
    if outcome.ok:
        return list(outcome.value) if isinstance(outcome.value, list) else [outcome.value]
    status = failed_status(outcome)
    return [CaseResult(case=case, status=status, error=outcome.error) for case in batch]


def _guarded(measure: Measure, case: BenchCase, settings: MeasureSettings) -> CaseResult:
    """An injected measure function that raises still yields a stored error, like measure_case."""
    try:
        return measure(case, settings)
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        return CaseResult(
            case=case, status=OOM if is_oom(exc) else ERROR, error=describe_error(exc)
        )


def _with_limit(settings: MeasureSettings, limit: int) -> MeasureSettings:
    return replace(settings, memory_limit_bytes=limit)


def _settings_meta(settings: MeasureSettings) -> dict[str, Any]:
    return asdict(settings)
