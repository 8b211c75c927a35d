"""Memory and FLOPs predicted without allocating: the case runs on FakeTensors (meta storage).

A FakeTensorMode builds the module and inputs and runs the step with shapes only; a StorageTracker
counts live storage bytes and a FlopCounterMode the FLOPs. Any length on any target device takes
seconds on a laptop. The fake device is the target device when this PyTorch build can fake it (CPU,
or CUDA when CUDA is present), so the same kernels are chosen as in a real run (e.g. SDPA's flash
kernel, which never materialises the scores); otherwise CPU stands in for the target and the method
says so.

Expected agreement with the measured number (profiler on CPU, allocator stats on CUDA): the
prediction cannot see memory a kernel allocates internally (scratch buffers invisible on meta) and
the tracker makes autograd accumulate gradients out of place; measured on CPU within ~5% or 2 MiB
(see tests/test_measure_predict.py), except where a kernel's scratch dominates.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from .cases import BenchCase, build_runnable
from .flops import count_flops
from .tracker import StorageTracker


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """Predicted bytes of one step of a case, and its FLOPs."""

    peak_bytes: int  # peak above the resident bytes during one step
    resident_bytes: int  # parameters, buffers, inputs, optimizer state
    flops: int
    device: str  # the target device type
    method: str  # e.g. "fake:cpu", or "fake:cpu standing in for cuda"

    @property
    def total_bytes(self) -> int:
        return self.resident_bytes + self.peak_bytes


def stand_in_device(device: str) -> str:
    """The device type FakeTensors can use for `device` in this PyTorch build."""
    kind = torch.device(device).type
    if kind == "cpu" or (kind == "cuda" and torch.cuda.is_available()):
        return kind
    return "cpu"


def predict_case(case: BenchCase, device: str | None = None) -> Prediction:
    """Predict peak/resident bytes and FLOPs of one step of `case` on `device` (default: its own).

    FLOPs are counted on the CPU's implementations whatever the device, so they measure the
    mechanism's work, not a library's: a fused CUDA kernel the counter cannot see (fla), or one it
    counts as dense (FlexAttention), would otherwise change them. Memory is predicted on the fake
    target device where its kernels trace there, else on the CPU standing in (the method says so).
    Raises UnavailableError when a backend cannot run on the stand-in device, and whatever the
    case raises on FakeTensors (e.g. a backend with data-dependent shapes, which the style guide
    forbids).
    """
    target = torch.device(device or case.device).type
    fake_device = stand_in_device(target)
    method = f"fake:{fake_device}" + ("" if fake_device == target else f" standing in for {target}")
    cpu = _fake_step(case, "cpu", flops=True) if fake_device != "cpu" else None
    try:
        peak, resident, flops = _fake_step(case, fake_device, flops=cpu is None)
    except NotImplementedError as exc:  # an operator these counting modes cannot trace
        if cpu is None:
            raise
        (peak, resident, flops), method = cpu, f"fake:cpu standing in for {target} ({exc})"
    if cpu is not None:
        flops = cpu[2]
    return Prediction(
        peak_bytes=peak, resident_bytes=resident, flops=flops, device=target, method=method
    )


def _fake_step(case: BenchCase, device: str, *, flops: bool) -> tuple[int, int, int]:
    """(peak above resident, resident bytes, FLOPs or 0) of one step on FakeTensors of `device`."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        runnable = build_runnable(case, device=device)
        runnable.step()  # warm-up: lazily created state (optimizer moments) becomes resident
        with StorageTracker() as tracker:
            counted = count_flops(runnable.step)[1] if flops else runnable.step() or 0
        return tracker.peak, runnable.resident_bytes(), counted
