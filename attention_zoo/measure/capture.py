"""Captured steps: a timed CUDA step recorded once as a CUDA graph and replayed, so its time is
the kernels' and not the Python that launches them (as torchtitan captures a training step and
gpt-fast a decode step). A step can be captured when it reads only tensors made before it (its
static inputs) and writes its state in place; what each case runs says whether it can, and why
not (`capture_obstacle`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ..attention.decode import KVCache, StaticKVCache, capturable_state
from ..errors import ConfigError
from .cases import Runnable
from .kernels import attention_cores, case_call
from .peers import is_peer

AUTO, ON, OFF = "auto", "on", "off"
CUDA_GRAPHS = (AUTO, ON, OFF)  # MeasureSettings.cuda_graphs: capture where it can, always, never
GRAPH_WARMUP = 3  # calls on a side stream before the capture: lazy state and autotuning settle
CAPTURE_CALLS = GRAPH_WARMUP + 2  # the step's calls a capture makes: warm-up, record, first replay
CAPTURED_TARGETS = ("attention", "block")


def check_cuda_graphs(value: object) -> None:
    """ConfigError unless `value` is one of CUDA_GRAPHS."""
    if value not in CUDA_GRAPHS:
        raise ConfigError(f"cuda_graphs {value!r} is not one of: {', '.join(CUDA_GRAPHS)}")


@dataclass(frozen=True)
class Capture:
    """Whether a case's timed step is replayed as a CUDA graph, and why not when it is not."""

    on: bool
    why: str = ""
    told: bool = True  # False where the device has no graphs: nothing to say of it
    differs: str = ""  # what the replay computes that the plain step does not (replay_difference)

    def fact(self) -> dict[str, Any]:
        """What the store keeps with the case (its facts' "cuda_graphs")."""
        return {
            "on": self.on,
            **({"why": self.why} if self.why else {}),
            **({"differs": self.differs} if self.on and self.differs else {}),
        }


def graphs_apply(device: str) -> bool:
    """Whether steps on `device` can be captured at all: the one device check."""
    return torch.device(device).type == "cuda"


def capture_obstacle(runnable: Runnable) -> str | None:
    """Why the case's step cannot be captured in a CUDA graph on its device, or None: the
    device, then what its target, mode, decoding state and attention cores state."""
    case = runnable.case
    if not graphs_apply(case.device):
        return f"CUDA graphs capture CUDA work; this case runs on {case.device}"
    return step_obstacle(runnable)


def step_obstacle(runnable: Runnable) -> str | None:
    """capture_obstacle without the device check: what would stop a capture of this step on
    CUDA (the attention cores as the pick rule chooses for the case's own device)."""
    case, module = runnable.case, runnable.module
    if case.target not in CAPTURED_TARGETS:
        return (
            f"captured steps cover the {' and '.join(CAPTURED_TARGETS)} targets (a model's "
            "reversible and checkpointed residuals read and set the RNG state on the host)"
        )
    if is_peer(case.backend) or module is None:
        return f"{case.backend} is another library's module, which states nothing about capture"
    if runnable.state is not None and case.mode == "decode":
        state = runnable.state()
        if capturable_state(runnable.module, state) is None:
            return f"its decoding state ({type(state).__name__}) {type(state).uncapturable}"
    for core in attention_cores(module):
        if reason := core.capture_obstacle(case_call(case, core), case.mode):
            return f"{type(core).__name__}: {reason}"
    return None


def choose_capture(runnable: Runnable, request: str) -> Capture:
    """The capture a case gets for --cuda-graphs `request`: off when asked; on where nothing
    stands in the way (auto) or else not (auto: stated why; on: ConfigError, one line)."""
    check_cuda_graphs(request)
    told = graphs_apply(runnable.case.device)
    if request == OFF:
        return Capture(False, "--cuda-graphs off", told)
    reason = capture_obstacle(runnable)
    if reason is None:
        return Capture(True, differs=replay_difference(runnable))
    if request == ON:
        raise ConfigError(f"--cuda-graphs on cannot capture this case: {reason}")
    return Capture(False, reason, told)


def replay_difference(runnable: Runnable) -> str:
    """What a replay of the case's step computes that its plain step does not, or "": a decode
    step on a plain KV cache replays on its form counted on the device, which attends every slot
    of the cache, those past the count masked, where the plain step attends only the keys so far
    (unmasked without padding): more keys, perhaps another kernel, and the rows time that."""
    case = runnable.case
    if runnable.state is None or case.mode != "decode":
        return ""
    state = runnable.state()
    if type(state) is KVCache and isinstance(
        capturable_state(runnable.module, state), StaticKVCache
    ):
        return f"attends all {state.shape.max_length} cache slots, masked past its count"
    return ""


class Graph(Protocol):
    """What capture needs of torch.cuda.CUDAGraph: replay the kernels it recorded."""

    def replay(self) -> None: ...


@dataclass(frozen=True)
class GraphPool:
    """What the captures of a group share: a memory pool (their graphs are never replayed at
    once) and the stream they are captured on (the allocator hands a capture only blocks freed
    on its own stream, so captures on different streams would not share the pool)."""

    handle: Any  # torch.cuda.graph_pool_handle()
    stream: Any  # torch.cuda.Stream


# (kernels, device, pool) -> the recording; pool: what the graphs of a group share
Recorder = Callable[[Callable[[], None], torch.device, GraphPool | None], Graph]


def graph_pool(device: torch.device | str) -> GraphPool | None:
    """One GraphPool for the graphs of a group, or None off CUDA."""
    if torch.device(device).type != "cuda":
        return None
    return GraphPool(torch.cuda.graph_pool_handle(), torch.cuda.Stream(device))


def cuda_graph(
    kernels: Callable[[], None], device: torch.device, pool: GraphPool | None = None
) -> Graph:
    """kernels() recorded into a CUDA graph after GRAPH_WARMUP calls on a side stream (cuBLAS
    workspaces, the allocator and autotuned kernels settle outside the capture), then replayed
    once (a graph's first replay uploads it). A failed capture raises its own error and leaves
    the current stream and the allocator as they were (see `record_graph`)."""
    with torch.cuda.device(device):
        pool = pool or graph_pool(device)
        assert pool is not None  # a CUDA device
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(GRAPH_WARMUP):
                kernels()
        torch.cuda.current_stream(device).wait_stream(side)
        torch.cuda.synchronize(device)
        # the warm-up's cached blocks go back to the device, as torch.cuda.graph frees them: a
        # capture allocates only from its own pool, so they would double the memory it needs
        torch.cuda.empty_cache()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(pool.stream):  # capture never runs on the default
            record_graph(graph, kernels, pool.handle)
        graph.replay()
        torch.cuda.synchronize(device)
    return graph


def record_graph(graph: Any, kernels: Callable[[], None], pool: Any) -> None:
    """kernels() captured into `graph` (a torch.cuda.CUDAGraph) on the current stream, allocating
    from `pool`. A capture that fails is ended and its hold on the pool given back: capture_end
    raises before it tells the allocator the capture is over, and a graph whose capture never
    ended does not release its pool, which would leave the allocator capturing for good (no
    empty_cache, no freeing of cached blocks to retry an allocation)."""
    began = ended = False
    try:
        graph.capture_begin(pool=pool)
        began = True
        try:
            kernels()
        except BaseException:
            with contextlib.suppress(RuntimeError):  # an invalid capture: the error says why
                graph.capture_end()
                ended = True
            raise
        graph.capture_end()
    except BaseException:
        if not ended:  # capture_end may raise past ending the capture (a failed instantiation)
            with contextlib.suppress(RuntimeError):
                graph.pool()  # raises unless the capture ended
                ended = True
        if ended:
            graph.reset()  # a capture that ended: the graph releases its pool itself, once
        else:
            end_failed_capture(pool, began)
        raise


def end_failed_capture(pool: Any, began: bool) -> None:
    """The allocator told that a failed capture into `pool` is over and the capture's use of the
    pool released, as torch.cuda.use_mem_pool ends one. Ending raises where capture_end got as
    far as ending it, or where capture_begin never began (then there is nothing to release)."""
    index = torch.cuda.current_device()
    try:
        torch._C._cuda_endAllocateToPool(index, pool)
    except RuntimeError:
        if not began:
            return
    torch._C._cuda_releasePool(index, pool)


@dataclass
class CapturedStep:
    """A step whose kernels are replayed from one recording: the host work a step keeps apart (a
    decode step's count of tokens, its state set back) runs before each replay."""

    host: Callable[[], None]
    graph: Graph
    plain_mode: Callable[[], None] | None = None  # puts the optimizer back as it was

    def __call__(self) -> None:
        self.host()
        self.graph.replay()

    def restore(self) -> None:
        """The optimizer put back as it was, for the plain step to run again (once)."""
        if self.plain_mode is not None:
            self.plain_mode()
            self.plain_mode = None


def captured_step(
    runnable: Runnable, pool: GraphPool | None = None, record: Recorder | None = None
) -> CapturedStep:
    """The runnable's step with its kernels replayed from one recording (`cuda_graph`, unless
    `record` says otherwise). Its optimizer runs in capturable mode (its step counts on the
    device), which a failed capture puts back as it was."""
    host, kernels = runnable.parts()
    device = torch.device(runnable.case.device)
    plain_mode = None
    if runnable.optimizer is not None:
        plain_mode = capturable(runnable.optimizer, device)
    try:
        graph = (record or cuda_graph)(kernels, device, pool)
    except BaseException:
        if plain_mode is not None:
            plain_mode()
        raise
    return CapturedStep(host, graph, plain_mode=plain_mode)


def capturable(optimizer: torch.optim.Optimizer, device: torch.device) -> Callable[[], None]:
    """An optimizer switched to torch.optim's capturable mode, its step counts moved to the
    device (where that mode keeps them): only a captured step pays for that mode. Returns what
    switches it back (the counts, as they are then, back where they were)."""
    modes = [group.get("capturable", False) for group in optimizer.param_groups]
    steps = [s for s in optimizer.state.values() if isinstance(s.get("step"), torch.Tensor)]
    homes = [state["step"].device for state in steps]
    for group in optimizer.param_groups:
        group["capturable"] = True
    for state in steps:
        state["step"] = state["step"].to(device)

    def back() -> None:
        for group, mode in zip(optimizer.param_groups, modes, strict=True):
            group["capturable"] = mode
        for state, home in zip(steps, homes, strict=True):
            state["step"] = state["step"].to(home)

    return back
