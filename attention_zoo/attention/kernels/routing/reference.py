"""The family's reference: a dense softmax under the route's token mask. O(t n): the tests'
reference, and the `math` implementation (what auto runs on short CPU inputs)."""

from __future__ import annotations

from torch import Tensor

from ...dispatch import expand_kv
from ..dense import dense_attention
from .route import Route, token_mask


def routed_reference(q: Tensor, k: Tensor, v: Tensor, route: Route, real: Tensor) -> Tensor:
    """q (b, h, t, d) at the route's positions, k, v (b, kv, n, d) -> (b, h, t, d_v): softmax
    over the routed keys (a query that sees none gets zeros)."""
    allowed = token_mask(route, k.shape[2], real)
    out = dense_attention(q, expand_kv(q, k), expand_kv(q, v), allowed, scale=q.shape[-1] ** -0.5)
    return out * allowed.any(-1, keepdim=True)
