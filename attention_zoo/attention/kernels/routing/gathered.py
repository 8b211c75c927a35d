"""Routed attention on the CPU (any device): each query's selected key blocks gathered, one
softmax over them, a segment of queries at a time, forward and backward.

Only one segment's gathered keys and values (and, backward, their gradients) exist at once; the
forward saves q, k, v, the output and the log-sum-exp. Shared KV heads are gathered from their
own head (no repeat), and their gradients summed back by index_add_.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd import Function

from ..masks import mask_value
from .route import Route, score_dtype

SCRATCH_BYTES = 16 << 20  # gathered blocks (and their gradients) of one segment of queries


class _Geometry:
    """One call's index arithmetic: which rows of the flat (b kv L, d) keys each query reads."""

    def __init__(self, route: Route, real: Tensor, q: Tensor, k: Tensor) -> None:
        self.route, self.real = route, real
        b, h, self.t, _ = q.shape
        self.kv, self.length = k.shape[1], k.shape[2]
        device = q.device
        heads = torch.arange(h, device=device) // (h // self.kv)
        self.base = (torch.arange(b, device=device)[:, None] * self.kv + heads) * self.length
        self.offsets = torch.arange(route.block, device=device)
        self.width = route.blocks.shape[-1] * route.block  # keys per query

    def segments(self, per_query: int) -> list[tuple[int, int]]:
        step = max(1, SCRATCH_BYTES // max(1, per_query))
        return [(s, min(s + step, self.t)) for s in range(0, self.t, step)]

    def rows(self, s: int, e: int) -> tuple[Tensor, Tensor]:
        """(b, h, e - s, K c) rows of the flat keys, and the allowed mask of those keys."""
        route = self.route
        pos = route.blocks[:, :, s:e, :, None] * route.block + self.offsets  # (b, h, e-s, K, c)
        used = route.used[:, :, s:e, :, None]
        pos = pos.flatten(-2)
        inside = pos < self.length
        pos = pos.clamp(max=self.length - 1)
        query = route.positions()[s:e, None]
        ok = used.expand(-1, -1, -1, -1, route.block).flatten(-2) & inside & (pos <= query)
        ok = ok & torch.gather(self.real[:, None, None, :].expand(*pos.shape[:3], -1), 3, pos)
        return self.base[:, :, None, None] + pos, ok


def _gather(flat: Tensor, rows: Tensor, dtype: torch.dtype) -> Tensor:
    return flat.index_select(0, rows.reshape(-1)).view(*rows.shape, flat.shape[-1]).to(dtype)


def _probs(q: Tensor, keys: Tensor, ok: Tensor, scale: float, lse: Tensor | None):
    """Probabilities (b, h, t, K c) of queries q (b, h, t, d) over their gathered keys, zero on a
    query that sees no key; and the log-sum-exp (b, h, t)."""
    scores = torch.matmul(keys, q.unsqueeze(-1)).squeeze(-1) * scale
    scores = scores.masked_fill(~ok, mask_value(scores.dtype))
    if lse is None:
        lse = torch.logsumexp(scores, dim=-1)
    return torch.exp(scores - lse[..., None]) * ok.any(-1, keepdim=True), lse


class GatheredRouted(Function):
    """softmax over the routed keys, a segment of queries at a time; see the module docstring."""

    @staticmethod
    def forward(ctx, q, k, v, geo, scale):  # type: ignore[override]
        wide = score_dtype(q.dtype)
        out = q.new_empty(*q.shape[:3], v.shape[-1])
        lse = q.new_empty(q.shape[:3], dtype=wide)
        k_flat, v_flat = k.reshape(-1, k.shape[-1]), v.reshape(-1, v.shape[-1])
        per_query = q.shape[0] * q.shape[1] * geo.width * (k.shape[-1] + v.shape[-1] + 2) * 4
        for s, e in geo.segments(per_query):
            rows, ok = geo.rows(s, e)
            q_s = q[:, :, s:e].to(wide)
            p, lse_s = _probs(q_s, _gather(k_flat, rows, wide), ok, scale, None)
            out[:, :, s:e] = torch.matmul(p.unsqueeze(-2), _gather(v_flat, rows, wide)).squeeze(-2)
            lse[:, :, s:e] = lse_s
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.geo, ctx.scale = geo, scale
        return out

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        geo, scale = ctx.geo, ctx.scale
        wide = lse.dtype
        k_flat, v_flat = k.reshape(-1, k.shape[-1]), v.reshape(-1, v.shape[-1])
        dq = torch.empty(q.shape, dtype=wide, device=q.device)
        dk = torch.zeros(k_flat.shape, dtype=wide, device=k.device)
        dv = torch.zeros(v_flat.shape, dtype=wide, device=v.device)
        per_query = q.shape[0] * q.shape[1] * geo.width * (k.shape[-1] + v.shape[-1] + 2) * 8
        for s, e in geo.segments(per_query):
            rows, ok = geo.rows(s, e)
            q_s, g_s = q[:, :, s:e].to(wide), g[:, :, s:e].to(wide)
            keys, values = _gather(k_flat, rows, wide), _gather(v_flat, rows, wide)
            p, _ = _probs(q_s, keys, ok, scale, lse[:, :, s:e])
            dp = torch.matmul(values, g_s.unsqueeze(-1)).squeeze(-1)
            delta = (g_s * out[:, :, s:e].to(wide)).sum(-1, keepdim=True)
            ds = p * (dp - delta) * scale  # (b, h, e - s, K c)
            dq[:, :, s:e] = torch.matmul(ds.unsqueeze(-2), keys).squeeze(-2)
            flat_rows = rows.reshape(-1)
            dk.index_add_(0, flat_rows, (ds.unsqueeze(-1) * q_s.unsqueeze(-2)).flatten(0, -2))
            dv.index_add_(0, flat_rows, (p.unsqueeze(-1) * g_s.unsqueeze(-2)).flatten(0, -2))
        dk, dv = dk.view(k.shape).to(k.dtype), dv.view(v.shape).to(v.dtype)
        return dq.to(q.dtype), dk, dv, None, None


def gathered_attention(q: Tensor, k: Tensor, v: Tensor, route: Route, real: Tensor) -> Tensor:
    """q (b, h, t, d) at the route's positions, keys and values (b, kv, L, d) at 0..L-1, real
    (b, L) -> (b, h, t, d_v): softmax(q k^T / sqrt(d)) v over the routed keys."""
    geo = _Geometry(route, real, q, k)
    return GatheredRouted.apply(q, k, v, geo, q.shape[-1] ** -0.5)
