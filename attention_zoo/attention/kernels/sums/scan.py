"""Kernelised attention by chunked prefix sums, a segment at a time: out_i = phi(q_i) S_i /
(phi(q_i) z_i).

S = sum_j phi(k_j) v_j^T and z = sum_j phi(k_j) over all keys (bidirectional) or keys j <= i
(causal, in the chunked form of Katharopoulos et al. 2020, section 3.3). One autograd.Function
keeps only q, k, v, the output and its denominator, recomputes the features in backward and
differentiates the sums analytically, so no (n, m) feature tensor outlives a segment.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from ..backward import hand_written_backward
from ..chunked import padded_length
from ..exp import exp_
from ..segments import SEGMENT_LENGTH, segments
from .plain import FAVOR, KernelSums, chunked_causal, compute_dtype, ones_column, pointwise


def scan_sums(
    sums: KernelSums, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None
) -> Tensor:
    """(b, h, n, d) queries, keys, values -> (b, h, n, d) in q's dtype (computed in
    compute_dtype's), a segment at a time (padded keys, mask False, get zero features and add
    nothing). The backward keeps the output in compute_dtype: its g . out nearly cancels
    g . v, so an output rounded to 16 bits would cost q's gradient most of its digits."""
    proj = None if sums.proj is None else sums.proj.to(compute_dtype(q.dtype))
    return _KernelScan.apply(
        q, k, v, key_padding_mask, proj, sums.feature_map, sums.scale, sums.causal, sums.chunk,
        sums.eps,
    )  # fmt: skip


class CallFeatures:
    """Feature maps of one call and their exact vector-Jacobian products, per segment."""

    def __init__(
        self, kind: str, proj: Tensor | None, scale: float, mask: Tensor | None, wide: torch.dtype
    ):
        self.kind, self.proj, self.scale, self.mask, self.wide = kind, proj, scale, mask, wide
        self.half_w = None if proj is None else proj.square().sum(-1) / 2  # (m,)

    def query(self, q: Tensor) -> Tensor:
        q = q.to(self.wide)
        if self.kind == FAVOR:
            # a per-query factor (its exp(-|q|^2/2), its max) cancels in out_i's ratio; the max
            # is a constant for the gradient
            logits = torch.matmul(q * self.scale, self.proj.T).add_(self.half_w)
            return exp_(logits.sub_(logits.amax(-1, keepdim=True)))
        return pointwise(self.kind, q)

    def key(self, k: Tensor, start: int, stop: int) -> Tensor:
        k = k.to(self.wide)
        keep = None if self.mask is None else self.mask[:, None, start:stop, None]
        if self.kind == FAVOR:
            # exp(w.k - |k|^2/2 - |w|^2/2) = exp(-|k - w|^2/2) <= 1: never overflows, needs no
            # max over keys (which would leak later keys into earlier outputs)
            ks = k * self.scale
            logits = torch.matmul(ks, self.proj.T)
            logits.sub_(ks.square().sum(-1, keepdim=True) / 2).sub_(self.half_w)
            if keep is not None:
                logits.masked_fill_(~keep, float("-inf"))
            return exp_(logits)
        phi = pointwise(self.kind, k)
        return phi if keep is None else phi.mul_(keep)

    def query_vjp(self, q: Tensor, phi: Tensor, dphi: Tensor) -> Tensor:
        if self.kind == FAVOR:
            return torch.matmul(dphi.mul_(phi), self.proj).mul_(self.scale)
        return _pointwise_vjp(self.kind, phi, dphi)

    def key_vjp(self, k: Tensor, phi: Tensor, dphi: Tensor) -> Tensor:
        # a padded key's phi is 0, so each form below gives it a zero gradient
        if self.kind == FAVOR:
            dlogits = dphi.mul_(phi)
            ks = k.to(self.wide) * self.scale
            dks = torch.matmul(dlogits, self.proj).sub_(ks.mul_(dlogits.sum(-1, keepdim=True)))
            return dks.mul_(self.scale)
        return _pointwise_vjp(self.kind, phi, dphi)


def _pointwise_vjp(kind: str, phi: Tensor, dphi: Tensor) -> Tensor:
    # elu+1: derivative 1 where x > 0 (phi > 1), exp(x) = phi elsewhere; relu: 1 where phi > 0
    slope = phi.clamp(max=1) if kind == "elu+1" else (phi > 0).to(phi.dtype)
    return dphi.mul_(slope)


def _chunked(ts: tuple[Tensor, ...], c: int) -> tuple[Tensor, ...]:
    """(b, h, L, *) -> (b, h, L'/c, c, *), zero-padded to whole chunks (zero rows add nothing)."""
    n = ts[0].shape[-2]
    npad = padded_length(n, c)
    if npad != n:  # the last segment only
        ts = tuple(F.pad(t, (0, 0, 0, npad - n)) for t in ts)
    return tuple(t.unflatten(-2, (npad // c, c)) for t in ts)


def _prefix(chunk_states: Tensor, state: Tensor, *, reverse: bool) -> tuple[Tensor, Tensor]:
    """Exclusive prefix (reverse: suffix) sums of (b, h, nc, p, r) chunk states started from the
    incoming state, and the outgoing state including every chunk."""
    if reverse:
        rest = torch.cat([chunk_states[:, :, 1:], state[:, :, None]], dim=2)
        outside = rest.flip(2).cumsum(2).flip(2)
        return outside, outside[:, :, 0] + chunk_states[:, :, 0]
    outside = torch.cat([state[:, :, None], chunk_states[:, :, :-1]], dim=2).cumsum(2)
    return outside, outside[:, :, -1] + chunk_states[:, :, -1]


def _reverse_scans(
    vx: Tensor, gx: Tensor, phi_q: Tensor, phi_k: Tensor, state: Tensor, c: int
) -> tuple[Tensor, Tensor, Tensor]:
    """dphi(k_j) = sum_{i >= j} (v'_j . G_i) phi(q_i) and dv'_j = sum_{i >= j} (phi(k_j) .
    phi(q_i)) G_i within the segment, plus the terms of the later segments' state = sum G_i
    phi(q_i)^T (d+1, m): both sums share it (the second uses its transpose)."""
    n = vx.shape[-2]
    vc, gc, qc, kc = _chunked((vx, gx, phi_q, phi_k), c)
    chunk_states = torch.matmul(gc.transpose(-1, -2), qc)  # (b, h, nc, d+1, m)
    after, total = _prefix(chunk_states, state, reverse=True)
    scores = torch.matmul(vc, gc.transpose(-1, -2)).triu_()
    dphi_k = torch.matmul(scores, qc).add_(torch.matmul(vc, after))
    scores = torch.matmul(kc, qc.transpose(-1, -2)).triu_()
    dvx = torch.matmul(scores, gc).add_(torch.matmul(kc, after.transpose(-1, -2)))
    return dphi_k.flatten(2, 3)[:, :, :n], dvx.flatten(2, 3)[:, :, :n], total


class _KernelScan(torch.autograd.Function):
    """Forward and analytic backward of kernelised attention, segment by segment.

    The Python loops run over segments, static (from shapes), because they bound memory: one
    vectorised pass holds every chunk's features, scores and states (and backward their
    gradients) at once. Within a segment all chunks are vectorised.
    Backward, with G_i = [g_i, -g_i . out_i] / den_i and v'_j = [v_j, 1]:
    dphi(q_i) = sum_{j<=i} (G_i . v'_j) phi(k_j) (a forward scan),
    dphi(k_j) = sum_{i>=j} (v'_j . G_i) phi(q_i), dv'_j = sum_{i>=j} (phi(k_j) . phi(q_i)) G_i
    (reverse scans); bidirectionally the sums run over all positions.
    """

    @staticmethod
    def forward(ctx, q, k, v, mask, proj, kind, scale, causal, chunk, eps):
        b, h, n, d = v.shape
        wide = compute_dtype(q.dtype)
        feats = CallFeatures(kind, proj, scale, mask, wide)
        c = min(chunk, n)
        bounds = segments(n, c, SEGMENT_LENGTH)
        m = proj.shape[0] if proj is not None else q.shape[-1]
        out = torch.empty(b, h, n, d, dtype=wide, device=q.device)
        den = torch.empty(b, h, n, 1, dtype=wide, device=q.device)
        state = torch.zeros(b, h, m, d + 1, dtype=wide, device=q.device)  # [S, z]
        if not causal:
            for s, e in bounds:
                phi_k = feats.key(k[:, :, s:e], s, e)
                state.add_(
                    torch.matmul(phi_k.transpose(-1, -2), ones_column(v[:, :, s:e].to(wide)))
                )
        for s, e in bounds:
            phi_q = feats.query(q[:, :, s:e])
            if causal:
                phi_k = feats.key(k[:, :, s:e], s, e)
                vx = ones_column(v[:, :, s:e].to(wide))
                y, state = chunked_causal(phi_q, phi_k, vx, state, c)
            else:
                y = torch.matmul(phi_q, state)
            den[:, :, s:e] = y[..., d:]
            out[:, :, s:e] = y[..., :d] / (y[..., d:] + eps)
        ctx.save_for_backward(q, k, v, mask, proj, out, den, None if causal else state)
        ctx.setup = (kind, scale, causal, c, eps)
        # in q's dtype: a 16-bit call's gradient then arrives in 16 bits, cast a segment at a
        # time, never whole in float32
        return out.to(q.dtype)

    @staticmethod
    @hand_written_backward
    def backward(ctx, g):
        q, k, v, mask, proj, out, den, total = ctx.saved_tensors
        kind, scale, causal, c, eps = ctx.setup
        b, h, n, d = v.shape
        wide = out.dtype
        feats = CallFeatures(kind, proj, scale, mask, wide)
        bounds = segments(n, c, SEGMENT_LENGTH)
        m = proj.shape[0] if proj is not None else q.shape[-1]
        dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))

        def grad_out(s: int, e: int) -> Tensor:  # G = [g, -g . out] / (den + eps)
            gs = g[:, :, s:e].to(wide)
            inv = (den[:, :, s:e] + eps).reciprocal()
            dot = (gs * out[:, :, s:e]).sum(-1, keepdim=True).neg_()
            return torch.cat([gs, dot], dim=-1).mul_(inv)

        # queries: a forward sweep (causal) or the saved totals
        state = torch.zeros(b, h, d + 1, m, dtype=wide, device=q.device)  # sum v'_j phi(k_j)^T
        for s, e in bounds:
            qs = q[:, :, s:e]
            phi_q, gx = feats.query(qs), grad_out(s, e)
            if causal:
                phi_k = feats.key(k[:, :, s:e], s, e)
                vx = ones_column(v[:, :, s:e].to(wide))
                dphi_q, state = chunked_causal(gx, vx, phi_k, state, c)
            else:
                dphi_q = torch.matmul(gx, total.transpose(-1, -2))
            dq[:, :, s:e] = feats.query_vjp(qs, phi_q, dphi_q)
        # keys and values: a reverse sweep (causal) or sums over all queries
        back = torch.zeros(b, h, d + 1, m, dtype=wide, device=q.device)  # sum G_i phi(q_i)^T
        if not causal:
            for s, e in bounds:
                gx_t = grad_out(s, e).transpose(-1, -2)
                back.add_(torch.matmul(gx_t, feats.query(q[:, :, s:e])))
        for s, e in reversed(bounds):
            ks = k[:, :, s:e]
            phi_k = feats.key(ks, s, e)
            vx = ones_column(v[:, :, s:e].to(wide))
            if causal:
                phi_q, gx = feats.query(q[:, :, s:e]), grad_out(s, e)
                dphi_k, dvx, back = _reverse_scans(vx, gx, phi_q, phi_k, back, c)
            else:
                dphi_k = torch.matmul(vx, back)
                dvx = torch.matmul(phi_k, back.transpose(-1, -2))
            dk[:, :, s:e] = feats.key_vjp(ks, phi_k, dphi_k)
            dv[:, :, s:e] = dvx[..., :d]
        return dq, dk, dv, None, None, None, None, None, None, None
