"""The routed backends' implementations and their order: key-block tiles on the CPU (the dense
reference where the sequence is too short for them to pay), FlexAttention on CUDA, per-query
gathers (what decoding steps use) by name. Each is a function (q, k, v, route, real) -> out that
the core hands its route to (`core.routed`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor

from ...dispatch import Call, Implementation, KernelTable
from ..flex import flex_dtype, flex_environment
from ..sums.plain import compute_dtype
from .flex_routed import routed_flex
from .gathered import gathered_attention
from .reference import routed_reference
from .route import Route
from .tiled import tiled_attention

# (q, k, v, route, real) -> out: what an implementation computes over one route
Attend = Callable[[Tensor, Tensor, Tensor, Route, Tensor], Tensor]
# keys per route slot below which the dense product beats the tiles' gathers and merges (CPU)
TILES_PAY_FROM = 100
# from this length the tiles run whatever the route: the dense product's (t, n) scores grow with it
DENSE_UP_TO = 1024


def tiles_pay(core: Any, call: Call) -> bool:
    """Whether auto runs the tiles rather than the dense product on `call`: from DENSE_UP_TO
    tokens and where the tiles score wider than the input (16-bit dtypes; the dense product
    scores in the input's) always; else where the sequence holds more keys than a query's route
    reads, and at least TILES_PAY_FROM keys per slot of it. `core.route_shape()`: (slots, block)."""
    if call.length >= DENSE_UP_TO or compute_dtype(call.dtype) != call.dtype:
        return True
    slots, block = core.route_shape()
    return call.length >= TILES_PAY_FROM * slots and call.length > slots * block


def _runs(attend: Attend) -> Callable[..., Tensor]:
    def run(core: Any, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, **extras: Tensor):
        return core.routed(attend, q, k, v, mask, **extras)

    return run


ROUTED_KERNELS = KernelTable(
    (
        Implementation(
            name="tiled",
            summary="the (query, block) pairs sorted by block, a product per tile of a block's "
            "queries, partial softmaxes merged; autograd",
            run=_runs(tiled_attention),
            grouped=True,
            pays=tiles_pay,
        ),
        Implementation(
            name="gathered",
            summary="each query's selected key blocks gathered, a segment of queries at a time "
            "(decoding steps: a few queries)",
            run=_runs(gathered_attention),
            grouped=True,
        ),
        Implementation(
            name="flex",
            summary="FlexAttention, the selected blocks as its kv lists (compiled on CUDA; "
            "PyTorch's dense eager version elsewhere)",
            run=_runs(routed_flex),
            devices=frozenset({"cpu", "cuda"}),
            grouped=True,
            environment=flex_environment,
            checks=(flex_dtype,),
        ),
        Implementation(
            name="math",
            summary="dense softmax under the selection's token mask, with autograd",
            run=_runs(routed_reference),
            grouped=True,
        ),
    ),
    {"cpu": ("tiled", "math"), "cuda": ("flex", "tiled")},
    plain="tiled",  # math is the dense reference: every query against every key, masked
)
