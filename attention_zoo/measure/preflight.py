"""What is known about a case before it runs: a named kernel that cannot compute it here, a
metric its implementation cannot be measured with, or a time predicted past the run's limit.
`zoo bench` refuses such cases before the store is opened, instead of storing a row per case."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from ..attention.base import AttentionCore
from ..attention.dispatch import AUTO, Call
from ..attention.spec import BACKENDS, causal_error, get_backend
from ..errors import UsageError, ZooError
from .cases import DECODE_MODES, DTYPES, BenchCase, sample_inputs
from .duration import expected_duration, over_limit
from .modes import UncompiledMode
from .predict import Prediction, predict_case, predict_flops
from .rate import CALIBRATION_LENGTH, cache_file, probe_case, probes_to_time
from .runner import MeasureSettings, unsupported_here
from .timing import fixed_threads

# metric groups measured under torch dispatch modes (the storage tracker, the FLOP counter)
DISPATCH_GROUPS = ("crosscheck", "predict", "flops")
PROBE_LENGTH = 128  # tokens of the probe that runs a named kernel under a dispatch mode

log = logging.getLogger(__name__)


class _PassThrough(UncompiledMode):
    """A dispatch mode that changes nothing: what the tracker and the FLOP counter run under."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def refusal(case: BenchCase, metrics: Sequence[str]) -> str | None:
    """Why `case` cannot run as asked, known without running it (one line), or None."""
    core = _named_core(case)
    if core is None:
        return None
    call = Call(
        torch.device(case.device).type,
        DTYPES[case.dtype],
        case.seq_len,
        case.head_dim,
        dropout=_trains(case) and bool(core.dropout_p),
    )
    try:
        impl = core.pick(call)
    except ZooError as exc:  # the dispatch rule's one line: reasons and auto's pick
        return str(exc)
    traced = [g for g in DISPATCH_GROUPS if g in metrics]
    if traced and call.device == "cpu" and (op := _untraceable(core, case)):
        kept = ",".join(g for g in metrics if g not in DISPATCH_GROUPS) or "time"
        return (
            f"{case.backend} kernel={impl.name!r} on cpu cannot be measured with metrics "
            f"{', '.join(traced)}: the storage tracker and the FLOP counter are torch dispatch "
            f"modes, which cannot follow {op} (a higher-order operator); measure it with "
            f"--metrics {kept}, or use kernel='auto' (picks {_auto_pick(core, call)})"
        )
    return None


def check_any_runs(cases: Sequence[BenchCase]) -> None:
    """UsageError when no case can run here, so the run would store only skipped cases: the first
    case's reason (--causal false where causality refuses it) and how many more cases there are."""
    reasons = [unsupported_here(case) for case in cases]
    if not cases or not all(reasons):
        return
    first, reason = cases[0], reasons[0]
    spec = get_backend(first.backend) if first.backend in BACKENDS else None
    decoding = first.mode in DECODE_MODES  # generation is causal whatever --causal says
    if first.causal and not decoding and spec and not spec.caps_for(**first.options).causal:
        reason = causal_error(first.backend, fix="pass --causal false")
    others, alike = len(cases) - 1, reasons.count(reasons[0]) - 1
    why = "" if alike == others else ", for this and other reasons"
    more = f" (and {others} more case{'s' if others > 1 else ''}{why})" if others else ""
    raise UsageError(f"{first.name()}: {reason}{more}; nothing was run or stored")


def check_cases(cases: Iterable[BenchCase], metrics: Sequence[str]) -> None:
    """Raise UsageError naming the first refused case's reason and how many cases share it."""
    refused: dict[str, list[BenchCase]] = {}
    for case in cases:
        if reason := refusal(case, metrics):
            refused.setdefault(reason, []).append(case)
    if not refused:
        return
    reason, which = next(iter(refused.items()))
    count = sum(len(c) for c in refused.values())
    more = f" (and {count - 1} more case{'s' if count > 2 else ''})" if count > 1 else ""
    raise UsageError(f"{which[0].name()}: {reason}{more}; nothing was run or stored")


@dataclass(frozen=True)
class TimeCheck:
    """What the time check found before a run: the cases refused, and the predictions it made,
    which the run takes instead of predicting those cases again."""

    refused: dict[str, str]  # case key -> the line that refuses it
    predicted: dict[str, Prediction]  # case key -> its prediction (a failed one is left out)


def time_check(cases: Iterable[BenchCase], settings: MeasureSettings) -> TimeCheck:
    """The cases predicted past settings' time limit (or timeout): their FLOPs (counted on meta,
    nothing allocated) at their rate here, at the run's thread count. A case whose prediction
    fails is left to the run, which reports it."""
    if settings.time_limit_s is None and settings.timeout_s is None:
        return TimeCheck(refused={}, predicted={})
    refused, predicted = {}, {}
    with fixed_threads(settings.threads):
        cases = [c for c in cases if not _unsupported(c)]  # the run stores those as n/a
        if unknown := probes_to_time(cases):
            log.warning(
                "timing %d case%s once (at up to %d tokens) to predict the run's time (kept in %s; "
                "--time-limit none skips this)",
                unknown,
                "s" if unknown > 1 else "",
                CALIBRATION_LENGTH,
                cache_file(),
            )
        for case in cases:
            if (prediction := _run_prediction(case)) is not None:
                predicted[case.key()] = prediction
        for case in cases:
            prediction = predicted.get(case.key())
            probe = predicted.get(probe_case(case).key())  # often another case of the grid
            try:
                expected = expected_duration(
                    case,
                    prediction.flops if prediction else predict_flops(case),
                    settings.metrics,
                    warmup=settings.warmup,
                    min_repeats=settings.min_repeats,
                    probe_flops=probe.flops if probe else None,
                )
            except Exception:  # the run reports what fails, as it always has
                continue
            if reason := over_limit(expected, settings.time_limit_s, settings.timeout_s):
                refused[case.key()] = f"{case.name()}: {reason}"
    return TimeCheck(refused=refused, predicted=predicted)


def _run_prediction(case: BenchCase) -> Prediction | None:
    """The prediction the run would make of a CPU case (on meta, nothing allocated), made here
    once for both; None for a CUDA case (its prediction traces on the device: this process would
    hold a CUDA context for the whole run) and where it fails (the run reports that)."""
    if torch.device(case.device).type != "cpu":
        return None
    try:
        return predict_case(case)
    except Exception:
        return None


def _unsupported(case: BenchCase) -> bool:
    """Whether the case cannot run here (an error saying so counts as not: the run reports it)."""
    try:
        return bool(case.unsupported())
    except Exception:
        return False


def _named_core(case: BenchCase) -> AttentionCore | None:
    """The case's core on the meta device when its options name a kernel (not auto), else None."""
    if len(case.backends()) != 1 or case.backend not in BACKENDS:
        return None
    if case.options.get("kernel", AUTO) == AUTO:
        return None
    spec = BACKENDS.get(case.backend)
    causal = True if case.mode in DECODE_MODES else case.causal
    try:
        with torch.device("meta"):
            core = spec.cls(spec.make_config(**case.options), causal=causal)
    except (ZooError, TypeError):  # options it does not take: the grid's own check says so
        return None
    return core if isinstance(core, AttentionCore) else None


def _trains(case: BenchCase) -> bool:
    """Whether the case runs its core in training mode (where attention dropout applies)."""
    if case.mode in DECODE_MODES:
        return False
    return not (case.target == "model" and case.mode == "forward")


def _untraceable(meta_core: AttentionCore, case: BenchCase) -> str | None:
    """The higher-order operator the case's implementation runs that a dispatch mode cannot
    follow (its name), found by a short forward on the CPU under one; None when it follows."""
    spec = BACKENDS.get(case.backend)
    causal = meta_core.causal
    n = min(case.seq_len, PROBE_LENGTH)
    dtype = DTYPES[case.dtype]
    try:
        core = spec.cls(spec.make_config(**case.options), causal=causal).to(dtype).eval()
        x = sample_inputs(case, torch.device("cpu"), dtype, length=n)
        with torch.no_grad(), _PassThrough():
            core(x.q, x.k, x.v, **x.extras)
    except NotImplementedError as exc:
        text = str(exc)
        if "HigherOrderOperator" in text:
            return _operator_name(text)
        return None
    except Exception:  # anything else fails the case itself, where it is reported
        return None
    return None


def _operator_name(text: str) -> str:
    """'flex_attention' from torch's 'no rule registered for HigherOrderOperator flex_attention'."""
    words = text.split("HigherOrderOperator", 1)[1].split()
    return words[0].rstrip(".,") if words else "an operator"


def _auto_pick(core: AttentionCore, call: Call) -> str:
    try:
        return type(core).kernels.pick("", AUTO, core, call).name
    except ZooError:
        return "none: nothing runs here"
