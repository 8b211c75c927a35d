"""Softmax attention over keys and values projected along the sequence (Linformer), keeping
neither the (n, k) scores nor the output for backward.

Autograd through `matmul(proj, k)` and SDPA keeps the output and a transposed copy of k and v, and
its projection gradient is a (b, h, k, n) batch of products summed afterwards (a peak above
SDPA's). Here the forward is one fused-kernel call (it returns the log-sum-exp); the backward
recomputes each segment of queries' probabilities from it, takes D = rowsum(dO * O) as
rowsum(P * dP) (the fused backward would need the output kept), and builds the projection
gradient a segment of positions at a time into the whole (k, max_length) gradient: its peak is
the inputs' gradients, the projection's and a few MiB of scratch.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd import Function

from ..backward import hand_written_backward
from ..cpu_flash import flash_forward
from ..exp import exp_

# Scratch one segment may hold: its score blocks (forward and backward) or its rearranged keys
# and values (projection gradient). The Python loops over segments bound the memory; their count
# comes from shapes only, so the meta device and torch.compile (fullgraph, unrolled) still hold.
SCRATCH_BYTES = 2 << 20


def _segments(n: int, row_bytes: int) -> list[tuple[int, int]]:
    """Position ranges [s, e) of at most SCRATCH_BYTES of scratch, `row_bytes` per position."""
    step = max(1, min(n, SCRATCH_BYTES // max(row_bytes, 1)))
    return [(s, min(s + step, n)) for s in range(0, n, step)]


def _heads_last(t: Tensor) -> Tensor:
    """(b, h, m, d) -> (m, b h d); a view where the layout allows, else one copy."""
    return t.permute(2, 0, 1, 3).reshape(t.shape[2], -1)


def project(proj: Tensor, x: Tensor) -> Tensor:
    """(k, n) x (b, h, n, d) -> (b, h, k, d). One product of (k, n) by (n, b h d) where x's
    layout is (n, b, h, d) (the block's projections at batch 1), else a batched product over
    the expanded projection; neither copies x."""
    b, h, n, d = x.shape
    rows = x.permute(2, 0, 1, 3)
    if rows.is_contiguous():
        return torch.mm(proj, rows.view(n, -1)).view(-1, b, h, d).permute(1, 2, 0, 3)
    return torch.matmul(proj.expand(b, h, *proj.shape), x)


def _project_backward(
    proj: Tensor, pairs: list[tuple[Tensor, Tensor]], needs: tuple[bool, bool]
) -> tuple[Tensor | None, list[Tensor | None]]:
    """Gradients of y = project(proj[:, :n], x) for each (dy, x) pair sharing `proj` (k, N >= n),
    a segment of positions at a time: (dproj (k, N), zero past n, or None; [dx (b, h, n, d) in
    x's layout, or None]) for needs = (proj, xs). dproj = sum_{b,h} dy x^T and dx = proj^T dy,
    with every pair and head side by side in one product per segment. The whole projection's
    gradient is written in place: no (k, n) slice of it is made and then copied."""
    n = pairs[0][1].shape[2]
    grads = torch.cat([_heads_last(dy) for dy, _ in pairs], dim=1)  # (k, pairs b h d)
    dproj = None
    if needs[0]:
        dproj = proj.new_zeros(proj.shape) if proj.shape[1] > n else proj.new_empty(proj.shape)
    dxs = [torch.empty_like(x) for _, x in pairs] if needs[1] else []
    # per position: the rearranged inputs (width), their product with grads (k), dx (width)
    width = grads.shape[1]
    for s, e in _segments(n, (2 * width + proj.shape[0]) * proj.itemsize):
        _project_backward_segment(proj, grads, pairs, dproj, dxs, s, e)
    return dproj, dxs or [None] * len(pairs)


def _project_backward_segment(
    proj: Tensor,
    grads: Tensor,
    pairs: list[tuple[Tensor, Tensor]],
    dproj: Tensor | None,
    dxs: list[Tensor],
    s: int,
    e: int,
) -> None:
    """Positions s:e of `_project_backward` (a function, so its scratch is freed on return)."""
    b, h, _, d = pairs[0][1].shape
    if dproj is not None:
        xs = grads.new_empty(e - s, len(pairs), b, h, d)  # every pair's rows, heads last
        for i, (_, x) in enumerate(pairs):
            xs[:, i] = x[:, :, s:e].permute(2, 0, 1, 3)
        dproj[:, s:e] = torch.mm(grads, xs.view(e - s, -1).transpose(0, 1))
    if dxs:
        dx_seg = torch.mm(proj[:, s:e].transpose(0, 1), grads).view(e - s, -1, b, h, d)
        for i, dx in enumerate(dxs):
            dx[:, :, s:e] = dx_seg[:, i].permute(1, 2, 0, 3)


def few_keys_forward(
    q: Tensor, keys: Tensor, values: Tensor, scale: float
) -> tuple[Tensor, Tensor]:
    """softmax(q keys^T * scale) values for (b, h, n, d) q over (b, h, m, d) keys and values,
    m small: (out, log-sum-exp (b, h, n)), PyTorch's fused CPU kernel in one call (faster than a
    segment at a time)."""
    # the raw kernel reads rows as dense: a strided last dimension is copied first
    dense = q if q.stride(-1) == 1 else q.contiguous()
    return flash_forward(dense, keys, values, 0.0, False, scale=scale)


def few_keys_backward(
    g: Tensor, q: Tensor, keys: Tensor, values: Tensor, lse: Tensor, scale: float
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dkeys, dvalues) of `few_keys_forward` given its log-sum-exp: each segment's
    probabilities recomputed, D = rowsum(dO * O) taken as rowsum(P * dP), so no output needed."""
    b, h, n, _ = q.shape
    dq = torch.empty_like(q)
    dkeys, dvalues = torch.zeros_like(keys), torch.zeros_like(values)
    for s, e in _segments(n, 3 * b * h * keys.shape[2] * q.itemsize):
        _backward_segment(g, q, keys, values, lse, scale, (dq, dkeys, dvalues), s, e)
    return dq, dkeys.mul_(scale), dvalues


def _backward_segment(
    g: Tensor,
    q: Tensor,
    keys: Tensor,
    values: Tensor,
    lse: Tensor,
    scale: float,
    grads: tuple[Tensor, Tensor, Tensor],
    s: int,
    e: int,
) -> None:
    """Queries s:e of `few_keys_backward`; dkeys accumulates without its scale."""
    dq, dkeys, dvalues = grads
    q_s, g_s = q[:, :, s:e], g[:, :, s:e]
    probs = torch.matmul(q_s, keys.transpose(-1, -2)).mul_(scale)
    probs = exp_(probs.sub_(lse[:, :, s:e, None]))
    dprobs = torch.matmul(g_s, values.transpose(-1, -2))
    # dS = P * (dP - rowsum(P * dP))
    dscores = dprobs.sub_((probs * dprobs).sum(-1, keepdim=True)).mul_(probs)
    dq[:, :, s:e] = torch.matmul(dscores, keys).mul_(scale)
    dkeys += torch.matmul(dscores.transpose(-1, -2), q_s)
    dvalues += torch.matmul(probs.transpose(-1, -2), g_s)


class ProjectedAttention(Function):
    """softmax(q (proj_k k)^T * scale) (proj_v v) for (b, h, n, d) q, k, v and (k, N >= n)
    projections, their first n columns used; proj_v None: proj_k projects both (one gradient,
    summed in place). Saves q, k, v, the projected keys and values and the log-sum-exp only."""

    @staticmethod
    def forward(ctx, q, k, v, proj_k, proj_v, scale):  # type: ignore[override]
        n = q.shape[2]
        keys = project(proj_k[:, :n], k)
        values = project((proj_k if proj_v is None else proj_v)[:, :n], v)
        out, lse = few_keys_forward(q, keys, values, scale)
        ctx.save_for_backward(q, k, v, proj_k, proj_v, keys, values, lse)
        ctx.scale = scale
        return out

    @staticmethod
    @hand_written_backward
    def backward(ctx, g):  # type: ignore[override]
        q, k, v, proj_k, proj_v, keys, values, lse = ctx.saved_tensors
        scale = ctx.scale
        need = ctx.needs_input_grad
        dq, dkeys, dvalues = few_keys_backward(g.to(q.dtype), q, keys, values, lse, scale)
        if proj_v is None:  # one projection: its gradient sums both uses
            dproj_k, (dk, dv) = _project_backward(
                proj_k, [(dkeys, k), (dvalues, v)], (need[3], need[1] or need[2])
            )
            dproj_v = None
        else:
            dproj_k, (dk,) = _project_backward(proj_k, [(dkeys, k)], (need[3], need[1]))
            dproj_v, (dv,) = _project_backward(proj_v, [(dvalues, v)], (need[4], need[2]))
        return dq, dk, dv, dproj_k, dproj_v, None
