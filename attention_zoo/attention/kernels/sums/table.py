"""The implementations of kernelised attention, shared by `linear` and `performer`: a core gives
`sums_for(q)` (what its call computes) and `feature_dim(head_dim)`."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ...dispatch import (
    Call,
    Implementation,
    KernelTable,
    Run,
    compile_reason,
    materialised,
    package_reason,
)
from .fla import fla_sums
from .plain import plain_sums
from .scan import scan_sums

FLA_VERSION = (0, 6)  # fla-core from 0.6 takes (b, n, h, *) only (earlier: head_first=True)


def fla_reason() -> str | None:
    """Why fla-core cannot be used here (found without importing it), or None."""
    if reason := package_reason("fla", "fla-core"):
        return reason
    try:
        version = tuple(int(p) for p in importlib.metadata.version("fla-core").split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        version = (0, 0)
    if version < FLA_VERSION:
        return f"needs fla-core >= {'.'.join(map(str, FLA_VERSION))} (its (b, n, h, *) layout)"
    return None


def _fla_environment(device: str) -> str | None:
    return fla_reason() or compile_reason(device)


def _causal(core: Any, call: Call) -> str | None:
    if not core.causal:
        return "fla's kernels are causal (bidirectional sums are two products: math)"
    return None


def _even(core: Any, call: Call) -> str | None:
    m = core.feature_dim(call.head_dim)
    if call.dtype in (torch.float16, torch.bfloat16) and m % 2:
        return f"fla's 16-bit backward needs an even feature count, not {m}"
    return None


def _run(fn: Callable[..., Tensor]) -> Run:
    """An implementation's run from a function of (sums, q, k, v, mask): the core gives sums."""
    return lambda core, q, k, v, mask: fn(core.sums_for(q), q, k, v, mask)


SUMS_KERNELS = KernelTable(
    (
        Implementation(
            name="scan",
            summary="chunked prefix sums a segment at a time, analytic backward (bounded memory)",
            run=_run(scan_sums),
        ),
        materialised(
            _run(plain_sums),
            "the whole sequence at once with autograd: two products, or every chunk at once",
        ),
        Implementation(
            name="fla",
            summary="fla-core's chunked causal linear-attention Triton kernel on our features "
            "(by name only: auto takes it once its CUDA accuracy test passes)",
            run=_run(fla_sums),
            devices=frozenset({"cuda"}),
            # its Triton products of float32 inputs run in TF32: float32 calls run math
            dtypes=frozenset({torch.bfloat16, torch.float16}),
            fake=False,
            environment=_fla_environment,
            checks=(_causal, _even),
        ),
    ),
    {"cpu": ("scan", "math"), "meta": ("scan", "math"), "cuda": ("math", "scan")},
)
