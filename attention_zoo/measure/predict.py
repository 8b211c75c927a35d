"""Memory and FLOPs predicted without allocating: the case runs on tensors with shapes only.

A StorageTracker counts live storage bytes and a FlopCounter the FLOPs while one step runs on
shapes. For the CPU that is the meta device, with SDPA taking the kernel the CPU would (on meta
torch always takes the math path); for CUDA, where this PyTorch build can fake it, FakeTensors of
CUDA, so the same kernels are chosen as in a real run (e.g. SDPA's flash kernel, which never
materialises the scores). Elsewhere the CPU stands in for the target and the method says so. On
the meta device each operator costs a fraction of FakeTensorMode's work: a long case is predicted
in seconds, and a case refused by its predicted time is refused at once.

Expected agreement with the measured number (profiler on CPU, allocator stats on CUDA): the
prediction cannot see memory a kernel allocates internally (scratch buffers invisible on meta) and
the tracker makes autograd accumulate gradients out of place; on CPU within the bound that
tests/test_measure_predict.py checks, except where a kernel's scratch dominates.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensorMode  # its first instance imports dynamo
from torch.library import _scoped_library
from torch.utils._python_dispatch import _disable_current_modes

from ..errors import UnavailableError, ZooError
from .cases import BenchCase, build_runnable
from .flops import count_flops
from .meta_memo import MetaMemo
from .tracker import StorageTracker

_OVERFLOW = "Storage size calculation overflowed"  # torch's words for a tensor past 2^63 bytes
_FLASH = 1  # torch._fused_sdp_choice's number for the flash kernel (SDPBackend.FLASH_ATTENTION)


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """Predicted bytes of one step of a case, and its FLOPs."""

    peak_bytes: int  # peak above the resident bytes during one step
    resident_bytes: int  # parameters, buffers, inputs, optimizer state
    flops: int
    device: str  # the target device type
    method: str  # e.g. "meta:cpu", "fake:cuda", or "meta:cpu standing in for cuda"

    @property
    def total_bytes(self) -> int:
        return self.resident_bytes + self.peak_bytes


class BeyondAnyMemory(ZooError, MemoryError):
    """A case with a tensor past the largest storage PyTorch can address: no machine holds it."""


def stand_in_device(device: str) -> str:
    """The device type whose kernels a prediction for `device` runs in this PyTorch build."""
    kind = torch.device(device).type
    if kind == "cpu" or (kind == "cuda" and torch.cuda.is_available()):
        return kind
    return "cpu"


def predict_case(case: BenchCase, device: str | None = None) -> Prediction:
    """Predict peak/resident bytes and FLOPs of one step of `case` on `device` (default: its own).

    FLOPs are counted on the CPU's implementations whatever the device (on the target's where a
    backend has none there, xformers), so they measure the mechanism's work, not a library's: a
    fused CUDA kernel the counter cannot see (fla), or one it counts as dense (FlexAttention),
    would otherwise change them. Memory is predicted on the target's kernels where they trace on
    shapes, else on the CPU's standing in (the method says so).
    Raises UnavailableError when a backend cannot run on the stand-in device, BeyondAnyMemory
    when a tensor it needs would be past 2^63 bytes, and whatever the case raises on shapes
    (e.g. a backend with data-dependent shapes, which the style guide forbids).
    """
    target = torch.device(device or case.device).type
    stand_in = stand_in_device(target)
    method = _method(stand_in) + ("" if stand_in == target else f" standing in for {target}")
    cpu = None
    if stand_in != "cpu":
        try:
            cpu = _shapes_step(case, "cpu", flops=True)
        except UnavailableError:  # the backend runs on the target only: counted there
            pass
    try:
        peak, resident, flops = _shapes_step(case, stand_in, flops=cpu is None)
    except NotImplementedError as exc:  # an operator these counting modes cannot trace
        if cpu is None:
            raise
        (peak, resident, flops) = cpu
        method = f"{_method('cpu')} standing in for {target} ({exc})"
    if cpu is not None:
        flops = cpu[2]
    return Prediction(
        peak_bytes=peak, resident_bytes=resident, flops=flops, device=target, method=method
    )


def predict_flops(case: BenchCase) -> int:
    """FLOPs of one step of `case`, as predict_case counts them (on the CPU's implementations),
    without tracking memory."""
    with _cpu_on_meta():
        runnable = build_runnable(case, device="meta")
        if case.mode != "forward":  # as predict_case: a decoding state moves on one token, an
            runnable.step()  # optimizer's moments appear; a forward has nothing to settle
        return count_flops(runnable.step)[1]


def _method(device: str) -> str:
    """How a prediction on `device`'s kernels runs: "meta:cpu" or "fake:cuda"."""
    return f"{'meta' if device == 'cpu' else 'fake'}:{device}"


def _shapes_step(case: BenchCase, device: str, *, flops: bool) -> tuple[int, int, int]:
    """(peak above resident, resident bytes, FLOPs or 0) of one step of `case` on `device`'s
    kernels, on shapes only: the meta device standing in for the CPU, FakeTensors otherwise."""
    if device == "cpu":
        if reason := case.unsupported("cpu"):  # meta would take, e.g., xformers
            raise UnavailableError(reason)
        shapes, built_on = _cpu_on_meta(), "meta"
    else:
        shapes, built_on = FakeTensorMode(allow_non_fake_inputs=True), device
    try:
        with shapes:
            runnable = build_runnable(case, device=built_on)
            runnable.step()  # warm-up: lazily created state (optimizer moments) becomes resident
            with StorageTracker() as tracker:
                counted = count_flops(runnable.step)[1] if flops else runnable.step() or 0
            return tracker.peak, runnable.resident_bytes(), counted
    except RuntimeError as exc:
        if _OVERFLOW not in str(exc):
            raise
        raise BeyondAnyMemory(
            f"{case.name()} needs a tensor past 2^63 bytes ({str(exc).split(_OVERFLOW)[1].strip()})"
        ) from None


@contextmanager
def _cpu_on_meta() -> Iterator[None]:
    """While open, operators on meta tensors stand in for the CPU's (_cpu_sdpa_on_meta), each run
    once per distinct input (MetaMemo: a step repeats them on the same shapes)."""
    with _cpu_sdpa_on_meta(), MetaMemo():
        yield


@contextmanager
def _cpu_sdpa_on_meta() -> Iterator[None]:
    """While open, SDPA on meta tensors runs the kernel the CPU would pick for the same shapes:
    on meta, torch always takes the math path, whose backward has one matmul fewer than the
    CPU's fused kernel. Registered at the dispatcher, so recomputation inside a custom autograd
    Function's backward (reversible layers) takes it too; removed on exit."""
    with _scoped_library("aten", "IMPL") as lib:
        lib.impl("scaled_dot_product_attention", _sdpa_as_on_cpu, "AutogradMeta")
        yield


def _sdpa_as_on_cpu(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """SDPA on meta tensors through the CPU's flash kernel where the CPU picks it, else math."""
    args = (query, key, value, attn_mask, dropout_p, is_causal)
    with _disable_current_modes():  # the stand-ins are not the case's memory or work
        stand_ins = [_cpu_stand_in(t) for t in (query, key, value, attn_mask)]
        choice = torch._fused_sdp_choice(
            *stand_ins[:3],
            attn_mask=stand_ins[3],
            dropout_p=dropout_p,
            is_causal=is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
        )
    if choice != _FLASH or query.dim() != 4:
        sdpa = torch.ops.aten.scaled_dot_product_attention.default
        return sdpa.decompose(*args, scale=scale, enable_gqa=enable_gqa)
    if attn_mask is not None and attn_mask.dtype == torch.bool:  # as SDPA does before its kernel
        masked = torch.scalar_tensor(-math.inf, dtype=query.dtype, device=attn_mask.device)
        attn_mask = torch.where(attn_mask, 0.0, masked)
        del masked  # freed before the kernel runs, as SDPA frees it
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    return flash(query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]


def _cpu_stand_in(t: Tensor | None) -> Tensor | None:
    """A CPU tensor with `t`'s shape, dtype and last stride over one row of storage: what the
    kernel choice reads, allocated small."""
    if t is None:
        return None
    row = torch.empty(t.shape[-1] if t.dim() else 1, dtype=t.dtype, device="cpu")
    if t.dim() == 0:
        return row[0]
    return row.as_strided(t.shape, (0,) * (t.dim() - 1) + (t.stride(-1),))
