"""Captured steps: a timed CUDA step recorded once as a CUDA graph and replayed, so its time is
the kernels' and not the Python that launches them (as torchtitan captures a training step and
gpt-fast a decode step). A step can be captured when it reads only tensors made before it (its
static inputs) and writes its state in place; what each case runs says whether it can, and why
not (`capture_obstacle`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ..attention.decode import capturable_state
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

    def fact(self) -> dict[str, Any]:
        """What the store keeps with the case (its facts' "cuda_graphs")."""
        return {"on": self.on, **({"why": self.why} if self.why else {})}


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
        return Capture(True)
    if request == ON:
        raise ConfigError(f"--cuda-graphs on cannot capture this case: {reason}")
    return Capture(False, reason, told)


class Graph(Protocol):
    """What capture needs of torch.cuda.CUDAGraph: replay the kernels it recorded."""

    def replay(self) -> None: ...


# (kernels, device, pool) -> the recording; pool: a memory pool the graphs of a group share
Recorder = Callable[[Callable[[], None], torch.device, Any], Graph]


def graph_pool(device: torch.device | str) -> Any:
    """One memory pool for the graphs of a group (never replayed at once), or None off CUDA."""
    return torch.cuda.graph_pool_handle() if torch.device(device).type == "cuda" else None


def cuda_graph(kernels: Callable[[], None], device: torch.device, pool: Any = None) -> Graph:
    """kernels() recorded into a CUDA graph after GRAPH_WARMUP calls on a side stream (cuBLAS
    workspaces, the allocator and autotuned kernels settle outside the capture), then replayed
    once (a graph's first replay uploads it). A failed capture raises its own error and leaves
    the current stream as it was."""
    with torch.cuda.device(device):
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(GRAPH_WARMUP):
                kernels()
        torch.cuda.current_stream(device).wait_stream(side)
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(torch.cuda.Stream(device)):  # capture never runs on the default
            graph.capture_begin(pool=pool)
            try:
                kernels()
            except BaseException:
                try:
                    graph.capture_end()
                except RuntimeError:  # the capture is invalid: the error above says why
                    pass
                raise
            graph.capture_end()
        graph.replay()
        torch.cuda.synchronize(device)
    return graph


def captured_step(
    runnable: Runnable, pool: Any = None, record: Recorder | None = None
) -> Callable[[], None]:
    """The runnable's step with its kernels replayed from one recording (`cuda_graph`, unless
    `record` says otherwise): the host work a step keeps apart (a decode step's count of tokens,
    its state set back) runs before each replay."""
    host, kernels = runnable.parts()
    device = torch.device(runnable.case.device)
    if runnable.optimizer is not None:
        capturable(runnable.optimizer, device)
    graph = (record or cuda_graph)(kernels, device, pool)

    def step() -> None:
        host()
        graph.replay()

    return step


def capturable(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """An optimizer switched to torch.optim's capturable mode, its step counts moved to the
    device (where that mode keeps them): only a captured step pays for that mode."""
    for group in optimizer.param_groups:
        group["capturable"] = True
    for state in optimizer.state.values():
        if isinstance(state.get("step"), torch.Tensor):
            state["step"] = state["step"].to(device)
