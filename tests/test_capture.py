"""Captured steps (`zoo bench --cuda-graphs`): which cases can be replayed from a CUDA graph and
why not, the decode step's device-side token and in-place state, and the runner's use of a
recording. CUDA graphs need a GPU; here a recorder that warms up and replays by calling the
kernels stands in for one, so everything around the capture runs on the CPU, and a stand-in for
torch.cuda's streams, graphs and allocator checks what a capture leaves behind when it fails."""

from __future__ import annotations

import contextlib
import itertools
from collections import Counter
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from attention_zoo.attention import decode
from attention_zoo.attention.base import AttentionCore
from attention_zoo.attention.dispatch import Call
from attention_zoo.attention.kernels.rounds.circular import CircularPlan
from attention_zoo.attention.spec import build_attention
from attention_zoo.attention.state import DecodeState, StateShape
from attention_zoo.cli import main
from attention_zoo.errors import ConfigError
from attention_zoo.measure import capture, runner
from attention_zoo.measure.capture import (
    GRAPH_WARMUP,
    Capture,
    GraphPool,
    captured_step,
    choose_capture,
    cuda_graph,
    step_obstacle,
)
from attention_zoo.measure.cases import BenchCase, build_runnable
from attention_zoo.measure.duration import CaseTimedOut
from attention_zoo.measure.labels import kernel_text
from attention_zoo.measure.runner import MeasureSettings, measure_case, measure_group

SMALL = {"seq_len": 64, "num_heads": 2, "head_dim": 16}


def _runnable(backend: str, **changes):
    return build_runnable(BenchCase(backend=backend, **{**SMALL, **changes}))


class Recorder:
    """A CPU stand-in for cuda_graph: the warm-up calls and the first replay (a capture itself
    runs nothing), then a 'replay' that calls the kernels (a graph replays exactly the kernels it
    recorded)."""

    def __init__(self) -> None:
        self.recorded = 0

    def __call__(self, kernels, device, pool):
        self.recorded += 1
        for _ in range(GRAPH_WARMUP + 1):
            kernels()
        return SimpleNamespace(replay=kernels)


def test_the_requests_and_the_one_device_check():
    run = _runnable("sdpa", mode="forward+backward")
    assert choose_capture(run, "off") == Capture(False, "--cuda-graphs off", told=False)
    auto = choose_capture(run, "auto")
    assert not auto.on and "runs on cpu" in auto.why
    with pytest.raises(ConfigError, match="cannot capture this case: CUDA graphs capture CUDA"):
        choose_capture(run, "on")
    with pytest.raises(ConfigError, match="auto, on, off"):
        MeasureSettings(cuda_graphs="yes")
    assert Capture(True).fact() == {"on": True}
    assert Capture(False, "why").fact() == {"on": False, "why": "why"}


@pytest.mark.parametrize(
    "backend, changes, words",
    [
        ("sdpa", {"mode": "forward+backward"}, None),
        ("local", {"mode": "forward"}, None),
        ("lsh", {"mode": "forward+backward"}, None),
        ("lsh", {"mode": "forward", "options": {"seed": 3}}, "its seeded rotations"),
        ("sdpa", {"target": "block", "mode": "train-step"}, None),
        ("sdpa", {"target": "model", "mode": "forward"}, "attention and block targets"),
        ("lsh", {"mode": "prefill", "new_tokens": 4}, "its prefill sets the RNG state"),
        ("lsh", {"mode": "decode", "new_tokens": 4, "options": {"seed": 3}}, None),
        (
            "lsh",
            {"mode": "decode", "new_tokens": 4, "options": {"seed": 3, "semantics": "hf"}},
            "(LSHCache) attends over the cache",
        ),
        ("linear", {"mode": "decode", "new_tokens": 4, "decoder": "recompute"}, "RecomputeState"),
        ("linear", {"mode": "decode", "new_tokens": 4}, None),
        ("retention", {"mode": "decode", "new_tokens": 4}, None),
        ("gated-deltanet", {"mode": "decode", "new_tokens": 4}, None),
        ("sdpa", {"mode": "decode", "new_tokens": 4}, None),
        ("differential", {"mode": "decode", "new_tokens": 4}, None),
        ("moba", {"mode": "decode", "new_tokens": 4}, "(BlocksState) attends over the cache"),
        ("local", {"mode": "decode", "new_tokens": 4, "options": {"semantics": "hf"}}, None),
        ("local", {"mode": "decode", "new_tokens": 4}, "(WindowState) writes its ring"),
        ("sdpa", {"mode": "prefill", "new_tokens": 4}, None),
    ],
)
def test_what_stands_in_the_way_of_a_capture(backend, changes, words):
    """What each case states about capture (the kernels the pick rule chooses, its decoding
    state, its target); capturable ones have no obstacle."""
    reason = step_obstacle(_runnable(backend, **changes))
    if words is None:
        assert reason is None
    else:
        assert reason is not None and words in reason


CAPTURED_DECODERS = "linear performer retention gated-deltanet lsh sdpa full sigmoid differential"


@pytest.mark.parametrize("backend", CAPTURED_DECODERS.split())
def test_a_captured_decode_step_decodes_as_the_plain_one(backend):
    """The captured decode reads its token at a device-side position and writes its state in
    place; once the host sets the state back (the warm-up's calls are behind it), every call
    leaves the state the plain step leaves."""
    case = BenchCase(backend=backend, mode="decode", new_tokens=3, **SMALL)
    torch.manual_seed(0)
    plain = build_runnable(case)
    torch.manual_seed(0)
    graphed = build_runnable(case)
    recorder = Recorder()
    step = captured_step(graphed, record=recorder)
    assert recorder.recorded == 1
    for call in range(2 * case.new_tokens + 1):
        plain.step()
        step()
        if call >= case.new_tokens:  # both set back to the prompt alone at the same call
            for a, b in zip(plain.state().tensors(), graphed.state().tensors(), strict=True):
                torch.testing.assert_close(a, b)


@pytest.mark.parametrize(
    "backend, options",
    [("sdpa", {}), ("full", {}), ("sigmoid", {}), ("differential", {}), ("shared-qk", {}),
     ("local", {"semantics": "hf", "chunk_length": 4})],
)  # fmt: skip
@pytest.mark.parametrize("padded", [False, True])
def test_a_cache_counted_on_the_device_decodes_as_the_plain_one(backend, options, padded):
    """A KV cache whose count of positions is on the device (what a captured step writes and
    reads) gives the outputs of the plain one, token by token and a few at a time: its padding
    and what an earlier cycle left past its count stay hidden."""
    core = build_attention(backend, causal=True, **options)
    b, h, n, d, steps = 2, 2, 12, 16, (1, 1, 2, 1)
    x = core.layout.sample(b, h, n + sum(steps), d, generator=torch.Generator().manual_seed(1))
    mask = torch.ones(b, n, dtype=torch.bool)
    if padded:
        mask[1, 8:] = False
    shape = StateShape.of(x.q, x.k, x.v, n + sum(steps))
    states = []
    for _ in range(2):
        prompt = x.window(0, n)
        empty = decode.init_state(core, shape)
        states.append(decode.step(core, prompt.q, prompt.k, prompt.v, empty, mask)[1])
    plain, static = states[0], decode.static_cache(states[1])
    static.k[:, :, n:], static.v[:, :, n:], static.real[:, n:] = 9.0, 9.0, True  # a past cycle's
    start = n
    for t in steps:
        tokens = x.window(start, start + t)
        out, plain = decode.step(core, tokens.q, tokens.k, tokens.v, plain)
        again, static = decode.step(core, tokens.q, tokens.k, tokens.v, static)
        torch.testing.assert_close(again, out)
        start += t
    assert int(static.filled) == start


@pytest.mark.slow
def test_the_runner_times_the_replay_and_stores_the_choice(monkeypatch):
    """With a case that can be captured (the device check lifted), the timed step is the
    recording's replay, its memory measured on the step as it is, the choice a fact shown
    beside the kernel; under auto a capture that fails leaves the step timed as it is."""
    recorder = Recorder()
    monkeypatch.setattr(capture, "graphs_apply", lambda device: True)
    monkeypatch.setattr(capture, "cuda_graph", recorder)
    case = BenchCase(backend="sdpa", mode="forward+backward", **SMALL)
    settings = MeasureSettings(time_budget_s=0.0, min_repeats=3, metrics=("time", "memory"))
    on = measure_case(case, MeasureSettings(**{**settings.__dict__, "cuda_graphs": "on"}))
    assert on.status == "ok" and on.value("time_median") > 0 and on.value("peak_bytes") > 0
    assert recorder.recorded == 1 and on.facts["cuda_graphs"] == {"on": True}
    assert kernel_text(on.facts) == f"{on.facts['kernels']['sdpa']} (captured)"

    monkeypatch.setattr(capture, "cuda_graph", failing)
    auto = measure_case(case, settings)
    assert auto.status == "ok" and auto.value("time_median") > 0
    assert auto.facts["cuda_graphs"] == {
        "on": False,
        "why": f"capture failed: RuntimeError: {NOT_PERMITTED}",
    }
    strict = measure_case(case, MeasureSettings(**{**settings.__dict__, "cuda_graphs": "on"}))
    assert strict.status == "error" and "not permitted when stream is capturing" in strict.error


NOT_PERMITTED = "operation not permitted when stream is capturing"


def failing(kernels, device, pool):
    raise RuntimeError(NOT_PERMITTED)


@pytest.mark.slow
def test_a_group_is_captured_whole_or_not_at_all(monkeypatch):
    """Cases timed together are compared: all are replayed, or (auto) none when one cannot be
    captured or its capture fails, each saying why."""
    monkeypatch.setattr(capture, "graphs_apply", lambda device: True)
    recorder = Recorder()
    monkeypatch.setattr(capture, "cuda_graph", recorder)
    settings = MeasureSettings(time_budget_s=0.0, min_repeats=3, metrics=("time",))
    plain = BenchCase(backend="sdpa", mode="forward+backward", **SMALL)
    both = measure_group([plain, plain.replace(backend="local")], settings)
    assert recorder.recorded == 2 and [r.facts["cuda_graphs"] for r in both] == [{"on": True}] * 2
    seeded = plain.replace(backend="lsh", options={"seed": 1})
    held = measure_group([plain, seeded], settings)
    assert [r.status for r in held] == ["ok", "ok"] and recorder.recorded == 2
    assert (
        "lsh in its group is not (LSHAttention: its seeded rotations"
        in (held[0].facts["cuda_graphs"]["why"])
    )
    monkeypatch.setattr(capture, "cuda_graph", failing)
    failed = measure_group([plain, plain.replace(backend="local")], settings)
    assert [r.status for r in failed] == ["ok", "ok"]
    whys = [r.facts["cuda_graphs"]["why"] for r in failed]
    assert (
        whys[0] == "capture failed: RuntimeError: operation not permitted when stream is capturing"
    )
    assert whys[1].startswith("timed as it is, as sdpa in its group is not (capture failed")


def test_a_group_survives_a_timed_out_capture_beside_a_failed_one(monkeypatch):
    """A case stopped by its timeout while captured is a timeout; the next one's failed capture
    under auto leaves it timed as it is, and neither says it was captured."""
    monkeypatch.setattr(capture, "graphs_apply", lambda device: True)
    raised = iter([CaseTimedOut("stopped past --timeout"), RuntimeError(NOT_PERMITTED)])

    def record(kernels, device, pool):
        raise next(raised)

    monkeypatch.setattr(capture, "cuda_graph", record)
    settings = MeasureSettings(time_budget_s=0.0, min_repeats=3, metrics=("time",))
    plain = BenchCase(backend="sdpa", mode="forward+backward", **SMALL)
    late, failed = measure_group([plain, plain.replace(backend="local")], settings)
    assert (late.status, failed.status) == ("timeout", "ok")
    assert not late.facts["cuda_graphs"]["on"] and not failed.facts["cuda_graphs"]["on"]


def test_only_a_core_that_reads_positions_from_its_cache_decodes_on_a_counted_one():
    class HostPositions(type(build_attention("sdpa", causal=True))):
        cache_positions = False

    shape = StateShape(1, 2, 16, 8)
    core = build_attention("sdpa", causal=True)
    state = decode.init_state(core, shape)
    assert isinstance(decode.capturable_state(core, state), decode.StaticKVCache)
    assert decode.capturable_state(HostPositions(core.cfg, causal=True), state) is None
    with pytest.raises(TypeError, match="plain KVCache"):
        decode.static_cache(decode.recompute_state(shape))


def test_what_says_nothing_of_capture_is_not_captured():
    """A plugin's decoding state or core that does not say it can be captured is not."""

    class Plain(DecodeState):
        pass

    class Own(AttentionCore):
        def attend(self, q, k, v, key_padding_mask, **extras):
            return v

    assert Plain.uncapturable.startswith("does not say its step can be captured")
    call = Call("cuda", torch.float32, 64, 16)
    assert "own attend" in Own(SimpleNamespace(), causal=True).capture_obstacle(call, "forward")


def test_a_cpu_case_stores_no_capture_fact():
    case = BenchCase(backend="sdpa", **SMALL)
    result = measure_case(case, MeasureSettings(time_budget_s=0.0, metrics=("time",)))
    assert result.status == "ok" and "cuda_graphs" not in result.facts


def test_on_refuses_cases_off_cuda_in_one_line(capsys, tmp_path):
    code = main(
        ["bench", "--backends", "sdpa", "--lengths", "64", "--cuda-graphs", "on",
         "--store", str(tmp_path / "s.sqlite"), "--no-progress"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "--cuda-graphs on captures CUDA steps" in err
    assert "Traceback" not in err and not (tmp_path / "s.sqlite").exists()


def test_a_seeded_lsh_decode_is_captured_and_decodes_as_the_plain_one():
    """A decode step draws no rotations (it hashes with its state's), so a seeded LSH decode is
    captured, and replays what the plain step computes."""
    case = BenchCase(backend="lsh", mode="decode", new_tokens=3, options={"seed": 3}, **SMALL)
    torch.manual_seed(0)
    plain = build_runnable(case)
    torch.manual_seed(0)
    graphed = build_runnable(case)
    assert step_obstacle(graphed) is None
    step = captured_step(graphed, record=Recorder())
    for call in range(2 * case.new_tokens + 1):
        plain.step()
        step()
        if call >= case.new_tokens:
            for a, b in zip(plain.state().tensors(), graphed.state().tensors(), strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.slow
def test_a_replay_over_the_whole_cache_says_so(monkeypatch):
    """A decode step on a KV cache replays on the whole cache, masked past its count, where the
    plain step attends the keys so far: the stored fact and the kernel label say so; a state
    replayed as it is says nothing."""
    monkeypatch.setattr(capture, "graphs_apply", lambda device: True)
    monkeypatch.setattr(capture, "cuda_graph", Recorder())
    settings = MeasureSettings(time_budget_s=0.0, metrics=("time",), cuda_graphs="on")
    cache = measure_case(BenchCase(backend="sdpa", mode="decode", new_tokens=4, **SMALL), settings)
    differs = "attends all 68 cache slots, masked past its count"
    assert cache.status == "ok" and cache.facts["cuda_graphs"] == {"on": True, "differs": differs}
    assert kernel_text(cache.facts).endswith(f" (captured; {differs})")
    own = measure_case(BenchCase(backend="linear", mode="decode", new_tokens=4, **SMALL), settings)
    assert own.facts["cuda_graphs"] == {"on": True}
    assert Capture(False, "why", differs=differs).fact() == {"on": False, "why": "why"}


def _optimizers_built(monkeypatch) -> list[torch.optim.Optimizer]:
    """The optimizers of the runnables the runner builds from now on."""
    built: list[torch.optim.Optimizer] = []

    def build(case):
        run = build_runnable(case)
        built.append(run.optimizer)
        return run

    monkeypatch.setattr(runner, "build_runnable", build)
    return built


def test_a_failed_capture_leaves_the_optimizer_as_it_was(monkeypatch):
    """The optimizer is in capturable mode only while captured: a capture that fails, and under
    auto the others of its group that did not, put it back, so the plain steps timed after are
    the ones a plain run times (a capturable AdamW refuses to step on the CPU)."""
    monkeypatch.setattr(capture, "graphs_apply", lambda device: True)
    built = _optimizers_built(monkeypatch)
    outcomes = iter([SimpleNamespace(replay=lambda: None), RuntimeError(NOT_PERMITTED)])

    def record(kernels, device, pool):
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(capture, "cuda_graph", record)
    settings = MeasureSettings(time_budget_s=0.0, min_repeats=3, metrics=("time",))
    case = BenchCase(backend="sdpa", target="block", mode="train-step", **SMALL)
    results = measure_group([case, case.replace(backend="local")], settings)
    assert [r.status for r in results] == ["ok", "ok"]
    assert not any(r.facts["cuda_graphs"]["on"] for r in results)
    for optimizer in built:
        assert not any(group["capturable"] for group in optimizer.param_groups)

    run = build_runnable(case)
    run.step()
    with pytest.raises(RuntimeError, match="not permitted"):
        captured_step(run, record=failing)
    assert not run.optimizer.param_groups[0]["capturable"]
    step = captured_step(run, record=lambda kernels, device, pool: SimpleNamespace())
    assert run.optimizer.param_groups[0]["capturable"]
    step.restore()
    assert not run.optimizer.param_groups[0]["capturable"]
    assert all(s["step"].device.type == "cpu" for s in run.optimizer.state.values())


def test_a_group_captures_on_one_stream_into_one_pool(monkeypatch):
    """Every capture of a group gets the group's one pool and stream."""
    monkeypatch.setattr(capture, "graphs_apply", lambda device: True)
    made = []  # a new pool each call: one call per group, or the captures' pools differ

    def graph_pool(device):
        made.append(GraphPool(f"pool {len(made)}", f"stream {len(made)}"))
        return made[-1]

    monkeypatch.setattr(runner, "graph_pool", graph_pool)
    pools = []

    def record(kernels, device, pool):
        pools.append(pool)
        return SimpleNamespace(replay=kernels)

    monkeypatch.setattr(capture, "cuda_graph", record)
    settings = MeasureSettings(time_budget_s=0.0, min_repeats=3, metrics=("time",))
    plain = BenchCase(backend="sdpa", mode="forward+backward", **SMALL)
    measure_group([plain, plain.replace(backend="local"), plain.replace(backend="lsh")], settings)
    assert len(made) == 1 and len(pools) == 3 and all(pool is made[0] for pool in pools)


# ---- cuda_graph against a stand-in for torch.cuda: the allocator's bookkeeping of a capture --


class FakeCuda:
    """What cuda_graph calls of torch.cuda, recorded: streams, the caching allocator's captures
    under way and its pools' counts of graphs (as CUDACachingAllocator.cpp keeps them: ending a
    capture that is not under way raises, a pool released more often than used asserts, and
    emptying the cache while a capture is under way asserts)."""

    def __init__(self) -> None:
        self.default = SimpleNamespace(name="default", wait_stream=lambda other: None)
        self.current = self.default
        self.underway: list = []
        self.uses: Counter = Counter()
        self.log: list[str] = []
        self.capturing: FakeGraph | None = None
        self.handles = itertools.count(1)
        self.graphs: list[FakeGraph] = []

    def install(self, monkeypatch) -> None:
        cuda = torch.cuda
        for name, value in {
            "device": lambda device: contextlib.nullcontext(),
            "Stream": lambda device=None: SimpleNamespace(name="side", wait_stream=lambda o: None),
            "current_stream": lambda device=None: self.current,
            "stream": self.stream,
            "synchronize": lambda device=None: self.log.append("synchronize"),
            "empty_cache": self.empty_cache,
            "CUDAGraph": self.graph,
            "current_device": lambda: 0,
            "graph_pool_handle": lambda: (0, next(self.handles)),
        }.items():
            monkeypatch.setattr(cuda, name, value)
        monkeypatch.setattr(torch._C, "_cuda_endAllocateToPool", self.end, raising=False)
        monkeypatch.setattr(torch._C, "_cuda_releasePool", self.release, raising=False)

    @contextlib.contextmanager
    def stream(self, stream):
        before, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = before

    def graph(self) -> FakeGraph:
        self.graphs.append(FakeGraph(self))
        return self.graphs[-1]

    def begin(self, pool) -> None:
        self.uses[pool] += 1
        self.underway.append(pool)

    def end(self, index: int, pool) -> None:
        if pool not in self.underway:
            raise RuntimeError("endAllocatePool: not currently recording to mempool_id")
        self.underway.remove(pool)

    def release(self, index: int, pool) -> None:
        self.uses[pool] -= 1
        assert self.uses[pool] >= 0, "use_count >= 0 INTERNAL ASSERT FAILED"

    def empty_cache(self) -> None:
        assert not self.underway, "captures_underway.empty() INTERNAL ASSERT FAILED"
        self.log.append("empty_cache")


class FakeGraph:
    """torch.cuda.CUDAGraph as CUDAGraph.cpp runs it: capture_end ends the stream's capture
    (raising for an invalidated one) before the allocator's, then checks the graph; reset
    releases the pool of a capture that ended."""

    def __init__(self, cuda: FakeCuda) -> None:
        self.cuda, self.invalid, self.empty, self.ended = cuda, False, False, False
        self.uninstantiable = False

    def capture_begin(self, pool) -> None:
        if self.cuda.current is self.cuda.default:
            raise RuntimeError("CUDA graphs must be captured on a non-default stream.")
        self.pool_id, self.stream = pool, self.cuda.current
        self.cuda.begin(pool)
        self.cuda.capturing = self
        self.cuda.log.append("capture_begin")

    def capture_end(self) -> None:
        self.cuda.capturing = None
        if self.invalid:
            raise RuntimeError(
                "CUDA error: operation failed due to a previous error during capture"
            )
        self.cuda.end(0, self.pool_id)
        if self.empty:
            raise RuntimeError("Invalid capture.")
        self.ended = True
        if self.uninstantiable:
            raise RuntimeError("CUDA error: cudaGraphInstantiate failed")

    def pool(self):
        if not self.ended:
            raise RuntimeError("Called CUDAGraph::pool() without a preceding successful capture.")
        return self.pool_id

    def reset(self) -> None:
        if self.ended:
            self.cuda.release(0, self.pool_id)
            self.ended = False

    def replay(self) -> None:
        self.cuda.log.append("replay")


def _kernels(cuda: FakeCuda, fails: str | None):
    """A step's kernels that, while captured, sync (the capture is invalidated), record nothing
    (capture_end fails past the allocator's end), or are stopped by --timeout (a valid capture)."""

    def kernels() -> None:
        graph = cuda.capturing
        if graph is None:
            cuda.log.append("warm-up")
        elif fails == "syncs":
            graph.invalid = True
            raise RuntimeError(NOT_PERMITTED)
        elif fails == "records nothing":
            graph.empty = True
        elif fails == "cannot be instantiated":
            graph.uninstantiable = True
        elif fails == "stopped":
            raise CaseTimedOut("stopped past --timeout")

    return kernels


@pytest.mark.parametrize(
    "fails", ["syncs", "records nothing", "cannot be instantiated", "stopped", "on the default"]
)
def test_a_failed_capture_leaves_the_allocator_as_it_was(monkeypatch, fails):
    """However a capture fails (inside the capture, in capture_end before or after it ends the
    allocator's capture, or at capture_begin), it raises its own error, and the allocator has no
    capture under way and the pool no graph using it: the cache can be emptied again."""
    cuda = FakeCuda()
    cuda.install(monkeypatch)
    stream = cuda.default if fails == "on the default" else SimpleNamespace(name="capture")
    pool = GraphPool((0, 99), stream)
    kernels = _kernels(cuda, None if fails == "on the default" else fails)
    with pytest.raises((RuntimeError, CaseTimedOut)):
        cuda_graph(kernels, torch.device("cuda"), pool)
    for graph in cuda.graphs:  # as their destructors do: released once in all (uses >= 0)
        graph.reset()
    assert cuda.underway == [] and cuda.uses[pool.handle] == 0
    torch.cuda.empty_cache()


def test_a_capture_runs_on_the_pools_stream_after_the_cache_is_emptied(monkeypatch):
    """The warm-up runs on a side stream, the cache is emptied after it (its blocks would sit
    beside the capture's pool), and every capture given one GraphPool records on its stream into
    its pool, which each graph then uses."""
    cuda = FakeCuda()
    cuda.install(monkeypatch)
    pool = capture.graph_pool("cuda")
    first = cuda_graph(_kernels(cuda, None), torch.device("cuda"), pool)
    second = cuda_graph(_kernels(cuda, None), torch.device("cuda"), pool)
    warm = ["warm-up"] * GRAPH_WARMUP
    assert cuda.log == 2 * [
        *warm,
        "synchronize",
        "empty_cache",
        "capture_begin",
        "replay",
        "synchronize",
    ]
    assert first.stream is second.stream is pool.stream
    assert first.pool() == second.pool() == pool.handle
    assert cuda.underway == [] and cuda.uses[pool.handle] == 2
    alone = cuda_graph(_kernels(cuda, None), torch.device("cuda"))
    assert alone.pool() != pool.handle and alone.stream is not pool.stream


def test_lsh_and_local_windows_are_made_on_the_device():
    """The wrapped windows' shifts and per-offset counts are made by device ops (a copy from the
    host cannot be captured), equal to the host's rule, offsets past every chunk clamped."""
    for before, after, rounds, npad in [(1, 0, 1, 16), (3, 2, 1, 16), (7, 9, 2, 16), (2, 2, 3, 32)]:
        perm = torch.stack([torch.randperm(npad) for _ in range(rounds)]).expand(2, 2, -1, -1)
        plan = CircularPlan(
            chunk=8, before=before, after=after, causal=True, groups=[(0, rounds)], perm=perm,
            key_real=torch.ones(2, npad, dtype=torch.bool), scale=1.0, key_eps=None,
            self_partial=True,
        )  # fmt: skip
        shifts = plan.shift_tensor(perm.device)
        assert shifts.dtype == torch.long and shifts.tolist() == plan.shifts()
        total = plan.total_chunks
        reached = Counter(shift % total for shift in plan.shifts())
        per_offset = torch.tensor([reached[d] for d in range(total)], dtype=torch.int32)
        slot = torch.argsort(perm, dim=-1) + torch.arange(rounds)[:, None] * npad  # all rounds'
        chunk = slot // 8
        expected = per_offset[(chunk.unsqueeze(2) - chunk.unsqueeze(3)) % total].sum(3)
        assert torch.equal(plan.self_copies(), expected)


@pytest.mark.parametrize(
    "backend, options",
    [("lsh", {"kernel": "math"}), ("lsh", {"kernel": "math", "semantics": "hf"}),
     ("local", {"kernel": "math", "semantics": "hf"})],
)  # fmt: skip
def test_the_math_paths_a_graph_captures_make_no_tensor_from_host_values(
    monkeypatch, backend, options
):
    """LSH's and local's CUDA path (math) makes every tensor by device ops, never with
    torch.tensor, whose copy from pageable host memory a capture refuses; same outputs."""
    extra = {"num_buckets": 4, "seed": 1} if backend == "lsh" else {}
    core = build_attention(backend, causal=True, chunk_length=8, **extra, **options)
    q, k, v = (torch.randn(2, 2, 40, 16) for _ in range(3))
    k = q if backend == "lsh" else k
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[1, 35:] = False
    expected = core(q, k, v, mask)

    def refused(*args, **kwargs):
        raise AssertionError("a tensor made from host values")

    monkeypatch.setattr(torch, "tensor", refused)
    monkeypatch.setattr(torch, "as_tensor", refused)
    torch.testing.assert_close(core(q, k, v, mask), expected, rtol=0, atol=0)


# ---- on CUDA: real graphs (the gpu marker; the GPU check runs them) --------------------------

# the backends of the GPU check's grids and the block-routing ones; lsh draws new rotations
# every call, so its replay is compared with nothing
DRAWS_NOTHING = (
    "sdpa local sliding-window bigbird linear performer retention gla deltanet gated-deltanet "
    "moba nsa sigmoid differential"
).split()
GRAPHED = [*DRAWS_NOTHING, "lsh"]


# the GPU check's grid shape, whose kernels its warm-up compiled and tuned
GRID_CASE = {"device": "cuda", "dtype": "bfloat16", "seq_len": 16384}


@pytest.mark.gpu
@pytest.mark.parametrize(
    "backend",
    [pytest.param(b, marks=() if not i else pytest.mark.slow) for i, b in enumerate(DRAWS_NOTHING)],
)
def test_a_replayed_forward_equals_the_forward_on_cuda(backend):
    """A recording of the forward, replayed, writes what the forward returns (bf16, 16k; each
    forward without autograd compiles kernels of its own: all but the first are slow)."""
    case = BenchCase(backend=backend, **GRID_CASE)
    plain = build_runnable(case)
    expected = plain.output()
    static = torch.empty_like(expected)

    def kernels() -> None:
        with torch.no_grad():
            static.copy_(plain.output())

    step = captured_step(replace(plain, step=kernels, split=None))
    static.zero_()  # the capture's own calls wrote it: only the replay below may
    step()
    torch.cuda.synchronize()
    torch.testing.assert_close(static, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", CAPTURED_DECODERS.split())
def test_a_captured_decode_step_decodes_as_the_plain_one_on_cuda(backend):
    case = BenchCase(backend=backend, mode="decode", new_tokens=3, device="cuda", **SMALL)
    torch.manual_seed(0)
    plain = build_runnable(case)
    torch.manual_seed(0)
    graphed = build_runnable(case)
    step = captured_step(graphed)
    for call in range(2 * case.new_tokens + 1):
        plain.step()
        step()
        if call >= case.new_tokens:
            for a, b in zip(plain.state().tensors(), graphed.state().tensors(), strict=True):
                torch.testing.assert_close(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "mode", [pytest.param("forward", marks=pytest.mark.slow), "forward+backward"]
)
def test_every_grid_backend_is_captured_on_cuda(mode):
    """--cuda-graphs on: every backend of the GPU check's grids is captured and timed (bf16,
    16k: the grid's compiled kernels; the forward alone compiles its own: slow), and its facts
    say so."""
    settings = MeasureSettings(time_budget_s=0.0, metrics=("time",), cuda_graphs="on")
    failed = {}
    for backend in GRAPHED:
        case = BenchCase(backend=backend, mode=mode, **GRID_CASE)
        result = measure_case(case, settings)
        if result.status != "ok" or result.facts.get("cuda_graphs") != {"on": True}:
            failed[backend] = result.error or result.status
    assert not failed, failed
