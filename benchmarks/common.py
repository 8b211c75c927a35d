"""Shared helpers of the asv suite: the registry-driven parameters and case building with skips.

Everything that changes a result is a benchmark parameter, so asv records it with the result:
the device ("cpu", "cuda": both always listed, so CPU and GPU series share one grid and a device
that is absent is n/a), the torch thread count of timed benchmarks (1: a comparison of code must not
depend on how busy the other cores are), the sequence length, the dtype, the batch. Sizes are fixed
here, never read from the environment: two runs of one commit measure the same thing.
A case that cannot run here (device, dtype, causality) or a model that is not importable raises
NotImplementedError in setup, which asv shows as n/a instead of a failure.
"""

from __future__ import annotations

import os
import time
import timeit
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from attention_zoo.attention.spec import BACKENDS, get_backend, list_backends
from attention_zoo.blocks.residual import RESIDUALS
from attention_zoo.declarative import field_names
from attention_zoo.errors import PluginError
from attention_zoo.measure.cases import DTYPES, BenchCase, Runnable, build_runnable
from attention_zoo.measure.memory import cuda_peak, profiled_peak
from attention_zoo.measure.metrics import METRICS
from attention_zoo.measure.predict import predict_case
from attention_zoo.measure.timing import synchronize
from attention_zoo.measure.tracker import tracked_peak
from attention_zoo.plugins import ENV_VAR, load_plugins

from .allocator import steady_allocator

try:  # the input contract: every stream a backend declares (q, k, v and extras)
    from attention_zoo.measure.cases import sample_inputs
except ImportError:  # an older commit's package (the gate's base side): q, k, v of one shape
    sample_inputs = None
try:  # captured steps: a CUDA step replayed from a CUDA graph
    from attention_zoo.measure.capture import capture_obstacle, captured_step
except ImportError:  # an older commit's package: every step timed as it is
    capture_obstacle = captured_step = None


def load_suite_plugins() -> None:
    """Installed plugins and ZOO_IMPORT modules, whose backends are benchmarked too.

    asv imports the suite in a temporary folder, so a relative ZOO_IMPORT (`my_attention`,
    `plugins/mine.py`) is looked up in the folder asv was started from: the shell's $PWD, which
    asv's processes inherit (else asv's ASV_CONF_DIR, the folder of asv.conf.json). A ZOO_IMPORT
    module that fails to load stops the suite: asv would show no warning, and a run without the
    plugin would look like one with it."""
    here = os.getcwd()
    start = next(
        (
            d
            for d in (os.environ.get("PWD"), os.environ.get("ASV_CONF_DIR"))
            if d and os.path.isdir(d)
        ),
        here,
    )
    os.chdir(start)
    try:
        failures = load_plugins()
    finally:
        os.chdir(here)
    if named := [f for f in failures if f.origin.startswith(ENV_VAR)]:
        raise PluginError(named[0].message())


load_suite_plugins()
# Before asv forks its benchmark processes: each inherits glibc's fixed thresholds, so two
# processes of one commit time a step alike (allocator.py).
steady_allocator()
DEVICES = ["cpu", "cuda"]
THREADS = [1]
LENGTHS = [1024, 4096]  # the default suite: one chunk multiple and a 4x longer one
FULL_LENGTHS = [1024, 4096, 16384]  # Scaling: the efficient backends out to long sequences
PREDICTED_LENGTHS = [*LENGTHS, 65536]  # predictions allocate nothing: long lengths are cheap
MODES = ["forward", "forward+backward"]
TARGETS = ["attention", "block"]
F = TypeVar("F", bound=Callable[..., Any])


def backend_names() -> list[str]:
    """Every registered backend, available here or not (unavailable ones are skipped in setup)."""
    return [spec.name for spec in list_backends()]


def residual_names() -> list[str]:
    """Every registered residual variant."""
    return RESIDUALS.names()


def tracks(metric: str) -> Callable[[F], F]:
    """Mark an asv track_<metric> method as measuring `metric`: its unit comes from the catalogue
    (and the gate reads from the catalogue whether the metric is deterministic)."""

    def mark(method: F) -> F:
        if method.__name__ != f"track_{metric}":
            raise NameError(f"{method.__name__} measures {metric!r}: name it track_{metric}")
        method.metric = metric
        # a commit older than the metric (the gate's base) lacks it: its setup then says n/a
        method.unit = METRICS[metric].unit if metric in METRICS else "unknown"
        return method

    return mark


def setup(*args: Any, **kwargs: Any) -> None:
    """Run before every benchmark (asv calls a module-level setup): one thread and a fixed seed;
    a timed benchmark's `threads` parameter then sets its own count (`use`)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)


def use(device: str, threads: int = 1) -> None:
    """Select the parameters' device and thread count; NotImplementedError when the device is
    absent. CUDA is first touched here, after asv's fork, never at import."""
    if device == "cuda" and not torch.cuda.is_available():
        raise NotImplementedError("no CUDA device here")
    torch.set_num_threads(threads)


def require_backends(*names: str) -> None:
    known = set(backend_names())
    missing = [n for n in names if n not in known]
    if missing:
        raise NotImplementedError(
            f"backend(s) {missing} not registered (registered: {sorted(known)})"
        )


def case_for(**fields: Any) -> BenchCase:
    """A BenchCase (the device is a field); NotImplementedError when it cannot run here (also
    when an older commit, as the gate's base, lacks one of its backends)."""
    case = BenchCase(**fields)
    require_backends(*case.backends())
    if reason := case.unsupported():
        raise NotImplementedError(reason)
    return case


def clock(device: str) -> Callable[[], float]:
    """A timed benchmark's timer on `device`. CPU: the process's CPU time; at one torch thread
    that is what the step costs, without the time other processes take from it on a shared
    machine (on an idle one it equals the wall time). CUDA: wall time, the host waiting for the
    GPU included."""
    return time.process_time if torch.device(device).type == "cpu" else timeit.default_timer


def _once(owner: Any, case: BenchCase, make: Callable[[BenchCase], Runnable]) -> Runnable:
    """`make(case)` once per benchmark process, kept on `owner` (the benchmark instance), and
    `owner`'s timer set to the device's clock. asv runs setup again before every sample: each
    sample then times one warm step of the same case, not a rebuild."""
    owner.timer = clock(case.device)
    kept = getattr(owner, "_built", None)
    if kept is None or kept[0] != case:
        owner._built = (case, make(case))
    return owner._built[1]


def build(owner: Any, case: BenchCase) -> Runnable:
    """`case` built and warmed up (one untimed step), once per benchmark process (_once)."""
    return _once(owner, case, _build_warm)


def _build_warm(case: BenchCase) -> Runnable:
    runnable = build_runnable(case)
    runnable.step()
    synchronize(case.device)
    return runnable


def build_timed(owner: Any, case: BenchCase) -> Runnable:
    """`build`, for a benchmark that only times the step: on CUDA, where the case can be
    captured, its step is a CUDA graph's replay (as `zoo bench --cuda-graphs auto` times it)."""
    return _once(owner, case, _build_captured)


def _build_captured(case: BenchCase) -> Runnable:
    runnable = _build_warm(case)
    if capture_obstacle is not None and capture_obstacle(runnable) is None:
        runnable.step = captured_step(runnable)
    return runnable


def padding_options(backend: str, seq_len: int) -> dict[str, Any]:
    """Options a backend needs before it takes a key padding mask: a fixed `max_length` where
    its sizes would otherwise follow the sequence length (LSH's bucket count)."""
    if backend not in BACKENDS:  # e.g. the gate's base commit lacks it: case_for skips it
        return {}
    fields = field_names(get_backend(backend).config)
    return {"max_length": seq_len} if "max_length" in fields else {}


def build_padded(owner: Any, case: BenchCase) -> Runnable:
    """The attention core of `case` called with a key padding mask (_padded), once per process."""
    return _once(owner, case, _padded)


def _padded(case: BenchCase, padded_fraction: float = 0.25) -> Runnable:
    """The attention core of `case` called with a key padding mask: every row but the first has
    its last `padded_fraction` of tokens marked as padding (a batch of unequal lengths)."""
    plain = build_runnable(case)
    core, inputs, device = plain.module, plain.inputs, torch.device(case.device)
    extras: dict[str, torch.Tensor] = {}
    if sample_inputs is not None:
        grad = case.mode != "forward"
        x = sample_inputs(case, device, DTYPES[case.dtype], requires_grad=grad)
        q, k, v, extras, inputs = x.q, x.k, x.v, x.extras, x.leaves()
    else:  # build_runnable gives a shared-QK core two tensors (q is k) and the others three
        q, k, v = (inputs[0], inputs[0], inputs[1]) if len(inputs) == 2 else inputs
    mask = torch.ones(case.batch, case.seq_len, dtype=torch.bool, device=device)
    mask[1:, case.seq_len - int(case.seq_len * padded_fraction) :] = False

    def output() -> torch.Tensor:
        return core(q, k, v, key_padding_mask=mask, **extras)

    def forward() -> torch.Tensor:
        return output().sum()

    def step() -> None:
        if case.mode == "forward":
            with torch.no_grad():
                forward()
            return
        forward().backward()
        for t in inputs:
            t.grad = None

    step()
    synchronize(device)
    return Runnable(case, core, inputs, step, output=output)


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
    """Pay FakeTensorMode's one-time set-up (importing torch._dynamo, ~1 s) at import, so that
    asv's forkserver, which imports the suite once and forks per benchmark, does not pay it per
    fork. The mode is built, no op runs under it: an op asks torch.cuda.is_available(), which
    initialises CUDA's driver, and a process forked after that cannot use CUDA. Nothing here
    starts threads either (a process forked after that can hang). ZOO_ASV_NO_WARMUP=1 skips it
    (tests that only import the suite; no result changes)."""
    if os.environ.get("ZOO_ASV_NO_WARMUP"):
        return
    from torch._subclasses.fake_tensor import FakeTensorMode

    FakeTensorMode(allow_non_fake_inputs=True)


_warm_up()
