"""The implementations of kernelised attention, shared by `linear` and `performer`: a core gives
`sums_for(q)` (what its call computes) and `feature_dim(head_dim)`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor

from ...dispatch import (
    Call,
    Implementation,
    KernelTable,
    Run,
    materialised,
)
from ..fla_package import FLA_DTYPES, fla_environment
from .fla import fla_sums
from .plain import plain_sums
from .scan import scan_sums


def _causal(core: Any, call: Call) -> str | None:
    if not core.causal:
        return "fla's kernels are causal (bidirectional sums are two products: math)"
    return None


def _even(core: Any, call: Call) -> str | None:
    m = core.feature_dim(call.head_dim)
    if m % 2:
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
            dtypes=FLA_DTYPES,
            fake=False,
            environment=fla_environment,
            checks=(_causal, _even),
        ),
    ),
    {"cpu": ("scan", "math"), "cuda": ("math", "scan")},
)
