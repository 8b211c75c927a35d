"""Routed attention on the CPU (any device): each query's selected key blocks gathered, one
softmax over them, a segment of queries at a time, forward and backward.

Only one segment's gathered keys and values (and, backward, their gradients) exist at once; the
forward saves q, k, v, the output and the log-sum-exp. Keys are gathered a whole block per row
(one copy of c d values, not c copies of d), shared KV heads from their own head (no repeat), and
their gradients summed back by index_add_ the same way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd import Function

from ..backward import hand_written_backward
from ..exp import exp_, logsumexp
from ..masks import mask_value
from ..sums.plain import compute_dtype
from .route import Route, as_blocks, from_blocks

SCRATCH_BYTES = 16 << 20  # gathered blocks (and their gradients) of one segment of queries


class _Geometry:
    """One call's index arithmetic: which blocks of the flat keys (b kv nb, c d) each query
    reads, and which of their keys count."""

    def __init__(self, route: Route, real: Tensor, q: Tensor, k: Tensor) -> None:
        self.route, self.c = route, route.block
        b, h, self.t, _ = q.shape
        kv, length = k.shape[1], k.shape[2]
        self.nb = -(-length // self.c)
        pad = self.nb * self.c - length
        self.real = F.pad(real, (0, pad)) if pad else real  # (b, nb c)
        device = q.device
        heads = torch.arange(h, device=device) // (h // kv)
        self.base = (torch.arange(b, device=device)[:, None] * kv + heads) * self.nb  # (b, h)
        self.offsets = torch.arange(self.c, device=device)
        self.width = route.blocks.shape[-1] * self.c  # keys per query

    def segments(self, per_query: int) -> list[tuple[int, int]]:
        """Query ranges [s, e) of at most SCRATCH_BYTES of scratch (at least one query)."""
        step = max(1, SCRATCH_BYTES // max(1, per_query))
        return [(s, min(s + step, self.t)) for s in range(0, self.t, step)]

    def rows(self, s: int, e: int) -> tuple[Tensor, Tensor]:
        """(b, h, e - s, K) rows of the flat blocks, and the allowed mask (b, h, e - s, K c)."""
        route = self.route
        blocks = route.blocks[:, :, s:e]
        pos = (blocks[..., None] * self.c + self.offsets).flatten(-2)  # (b, h, e - s, K c)
        used = route.used[:, :, s:e, :, None].expand(-1, -1, -1, -1, self.c).flatten(-2)
        query = route.positions()[s:e, None]
        real = torch.gather(self.real[:, None, None, :].expand(*pos.shape[:3], -1), 3, pos)
        return self.base[:, :, None, None] + blocks, used & route.near(pos, query) & real


def _gather(flat: Tensor, rows: Tensor, d: int, dtype: torch.dtype) -> Tensor:
    """Blocks (b, h, t, K) of the flat (b kv nb, c d) -> keys (b, h, t, K c, d)."""
    return flat.index_select(0, rows.reshape(-1)).to(dtype).view(*rows.shape[:3], -1, d)


def _probs(
    q: Tensor, keys: Tensor, ok: Tensor, scale: float, lse: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Probabilities (b, h, t, K c) of queries q (b, h, t, d) over their gathered keys, zero on a
    query that sees no key; and the log-sum-exp (b, h, t)."""
    scores = torch.matmul(keys, q.unsqueeze(-1)).squeeze(-1) * scale
    scores = scores.masked_fill(~ok, mask_value(scores.dtype))
    if lse is None:
        lse = logsumexp(scores, dim=-1)
    return exp_(scores - lse[..., None]) * ok.any(-1, keepdim=True), lse


class GatheredRouted(Function):
    """softmax over the routed keys, a segment of queries at a time; see the module docstring."""

    @staticmethod
    def forward(ctx, q, k, v, geo, scale):  # type: ignore[override]
        wide = compute_dtype(q.dtype)
        d, dv = k.shape[-1], v.shape[-1]
        out = q.new_empty(*q.shape[:3], dv)
        lse = q.new_empty(q.shape[:3], dtype=wide)
        k_flat, v_flat = as_blocks(k, geo.c), as_blocks(v, geo.c)
        per_query = q.shape[0] * q.shape[1] * geo.width * (d + dv + 2) * 4
        for s, e in geo.segments(per_query):
            rows, ok = geo.rows(s, e)
            p, lse[:, :, s:e] = _probs(
                q[:, :, s:e].to(wide), _gather(k_flat, rows, d, wide), ok, scale, None
            )
            out[:, :, s:e] = torch.matmul(p.unsqueeze(-2), _gather(v_flat, rows, dv, wide))[
                ..., 0, :
            ]
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.geo, ctx.scale = geo, scale
        return out

    @staticmethod
    @hand_written_backward
    def backward(ctx, g):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        geo, scale = ctx.geo, ctx.scale
        wide, d, dv = lse.dtype, k.shape[-1], v.shape[-1]
        k_flat, v_flat = as_blocks(k, geo.c), as_blocks(v, geo.c)
        grad_q = torch.empty(q.shape, dtype=wide, device=q.device)
        grad_k = torch.zeros(k_flat.shape, dtype=wide, device=k.device)
        grad_v = torch.zeros(v_flat.shape, dtype=wide, device=v.device)
        per_query = q.shape[0] * q.shape[1] * geo.width * (d + dv + 2) * 8
        for s, e in geo.segments(per_query):
            rows, ok = geo.rows(s, e)
            q_s, g_s = q[:, :, s:e].to(wide), g[:, :, s:e].to(wide)
            keys, values = _gather(k_flat, rows, d, wide), _gather(v_flat, rows, dv, wide)
            p, _ = _probs(q_s, keys, ok, scale, lse[:, :, s:e])
            dp = torch.matmul(values, g_s.unsqueeze(-1)).squeeze(-1)
            delta = (g_s * out[:, :, s:e].to(wide)).sum(-1, keepdim=True)
            ds = p * (dp - delta) * scale  # (b, h, e - s, K c)
            grad_q[:, :, s:e] = torch.matmul(ds.unsqueeze(-2), keys).squeeze(-2)
            rows = rows.reshape(-1)
            grad_k.index_add_(
                0, rows, (ds.unsqueeze(-1) * q_s.unsqueeze(-2)).view(rows.numel(), -1)
            )
            grad_v.index_add_(0, rows, (p.unsqueeze(-1) * g_s.unsqueeze(-2)).view(rows.numel(), -1))
        return grad_q.to(q.dtype), from_blocks(grad_k, k), from_blocks(grad_v, v), None, None


def gathered_attention(q: Tensor, k: Tensor, v: Tensor, route: Route, real: Tensor) -> Tensor:
    """q (b, h, t, d) at the route's positions, keys and values (b, kv, L, d) at 0..L-1, real
    (b, L) -> (b, h, t, d_v): softmax(q k^T / sqrt(d)) v over the routed keys."""
    geo = _Geometry(route, real, q, k)
    return GatheredRouted.apply(q, k, v, geo, q.shape[-1] ** -0.5)
