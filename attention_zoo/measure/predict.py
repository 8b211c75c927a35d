"""Memory and FLOPs predicted without allocating: the case runs on FakeTensors (meta storage).

A FakeTensorMode builds the module and inputs and runs the step with shapes only; a StorageTracker
counts live storage bytes and a FlopCounterMode the FLOPs. Any length on any target device takes
seconds on a laptop. The fake device is the target device when this PyTorch build can fake it (CPU,
or CUDA when CUDA is present), so the same kernels are chosen as in a real run (e.g. SDPA's flash
kernel, which never materialises the scores); otherwise CPU stands in for the target and the method
says so.

FLOPs alone (`predict_flops`: what a time prediction needs) are counted on the meta device instead,
with SDPA taking the kernel the CPU would: the same count without FakeTensorMode, whose import
(torch._dynamo) costs seconds, so a case refused by its predicted time is refused at once.

Expected agreement with the measured number (profiler on CPU, allocator stats on CUDA): the
prediction cannot see memory a kernel allocates internally (scratch buffers invisible on meta) and
the tracker makes autograd accumulate gradients out of place; measured on CPU within ~5% or 2 MiB
(see tests/test_measure_predict.py), except where a kernel's scratch dominates.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensorMode  # its first instance imports dynamo
from torch.library import _scoped_library

from ..errors import UnavailableError
from .cases import BenchCase, build_runnable
from .flops import count_flops
from .tracker import StorageTracker

_FLASH = 1  # torch._fused_sdp_choice's number for the flash kernel (SDPBackend.FLASH_ATTENTION)


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

    FLOPs are counted on the CPU's implementations whatever the device (on the target's where a
    backend has none there, xformers), so they measure the mechanism's work, not a library's: a
    fused CUDA kernel the counter cannot see (fla), or one it counts as dense (FlexAttention),
    would otherwise change them. Memory is predicted on the fake
    target device where its kernels trace there, else on the CPU standing in (the method says so).
    Raises UnavailableError when a backend cannot run on the stand-in device, and whatever the
    case raises on FakeTensors (e.g. a backend with data-dependent shapes, which the style guide
    forbids).
    """
    target = torch.device(device or case.device).type
    fake_device = stand_in_device(target)
    method = f"fake:{fake_device}" + ("" if fake_device == target else f" standing in for {target}")
    cpu = None
    if fake_device != "cpu":
        try:
            cpu = _fake_step(case, "cpu", flops=True)
        except UnavailableError:  # the backend runs on the target only: counted there
            pass
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


def predict_flops(case: BenchCase) -> int:
    """FLOPs of one step of `case`, as predict_case counts them (on the CPU's implementations),
    counted on the meta device: nothing allocated and no FakeTensorMode to import."""
    with _cpu_sdpa_on_meta():
        runnable = build_runnable(case, device="meta")
        if case.mode != "forward":  # as predict_case: a decoding state moves on one token, an
            runnable.step()  # optimizer's moments appear; a forward has nothing to settle
        return count_flops(runnable.step)[1]


def _fake_step(case: BenchCase, device: str, *, flops: bool) -> tuple[int, int, int]:
    """(peak above resident, resident bytes, FLOPs or 0) of one step on FakeTensors of `device`."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        runnable = build_runnable(case, device=device)
        runnable.step()  # warm-up: lazily created state (optimizer moments) becomes resident
        with StorageTracker() as tracker:
            counted = count_flops(runnable.step)[1] if flops else runnable.step() or 0
        return tracker.peak, runnable.resident_bytes(), counted


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
    if enable_gqa and key.shape[-3] != query.shape[-3]:  # the CPU kernel gets repeated heads
        groups = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(groups, -3), value.repeat_interleave(groups, -3)
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
