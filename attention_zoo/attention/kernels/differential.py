"""Differential attention's fused CPU kernel: both softmax maps, their difference and the per-head
RMSNorm in one autograd Function that keeps the output, the second map's output and the two
log-sum-exps for its backward, and nothing the size of the keys.

The forward runs PyTorch's fused CPU kernel once per map, keys with the other half zeroed (q . [k1,
0] = q1 . k1: the kernel wants one width for q, k and v). The backward runs it on half-width views
with no copies: per map and per half of the value width, since the kernel's backward is linear in
(gradient, output) pairs given the map's log-sum-exp, the two halves' calls add up to the map's
gradient (as chunked.flash_backward_offset's partials do). Half-width calls give half-width q and k
gradients, where zero-padded keys would give full-width ones, and the first map's output is
recovered from the norm's output and the second map's, a half at a time, so it is never saved.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd import Function

from .masks import mask_value, real_keys_mask
from .sums.plain import compute_dtype

NORM_EPS = 1e-5  # the per-head RMSNorm's, as the paper's code

_flash_fwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def fused_differential(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    lam: Tensor,
    key_padding_mask: Tensor | None,
    *,
    causal: bool,
    out_scale: float,
) -> Tensor:
    """RMSNorm(softmax(q1 k1^T) v - lam softmax(q2 k2^T) v) * out_scale, each head's q and k
    split in halves: q (b, h, n, d), k (b, kv, n, d), v (b, kv, n, d), lam a scalar tensor."""
    mask = None
    if key_padding_mask is not None:  # additive, so the kernel still applies causality itself
        real = real_keys_mask(key_padding_mask)
        mask = torch.zeros(real.shape, dtype=q.dtype, device=q.device)
        mask.masked_fill_(~real, mask_value(q.dtype))
    # the fused kernel reads rows as dense vectors
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    return DifferentialFlash.apply(q, k, v, lam.to(q.dtype), mask, causal, out_scale)


class DifferentialFlash(Function):
    """Saves q, k, v, lambda, the output, the second map's output, the row scales and the two
    log-sum-exps; see the module docstring for the backward."""

    @staticmethod
    def forward(ctx, q, k, v, lam, mask, causal, out_scale):  # type: ignore[override]
        d = q.shape[-1]
        first = torch.arange(d, device=q.device) < d // 2
        call = dict(attn_mask=mask, scale=(d // 2) ** -0.5)
        out, lse1 = _flash_fwd(q, k * first, v, 0.0, causal, **call)
        second, lse2 = _flash_fwd(q, k * ~first, v, 0.0, causal, **call)
        out.addcmul_(second, lam, value=-1)  # the difference, in the first map's buffer
        rstd = _inverse_rms(out)
        out.mul_((rstd * out_scale).to(out.dtype))
        ctx.save_for_backward(q, k, v, lam, mask, out, second, rstd, lse1, lse2)
        ctx.causal, ctx.out_scale = causal, out_scale
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        q, k, v, lam, mask, out, second, rstd, lse1, lse2 = ctx.saved_tensors
        d, s = q.shape[-1], ctx.out_scale
        half = d // 2
        call = dict(attn_mask=mask, scale=half**-0.5)
        rstd = rstd.to(q.dtype)
        # the norm's backward, dx = rstd (s g - out (g . out) / (s d)), a half of the width at a
        # time so that each half is freed once both maps' calls have read it
        across = -rstd * torch.linalg.vecdot(grad, out).unsqueeze(-1) / (s * d)
        halves = (slice(0, half), slice(half, d))
        dx = [
            torch.mul(out[..., w], across, out=_heads_inside(out, half)).addcmul_(
                grad[..., w], rstd * s
            )
            for w in halves
        ]
        dlam = -sum(torch.linalg.vecdot(g, second[..., w]).sum() for g, w in zip(dx, halves))
        q1, q2, k1, k2 = (t[..., w] for t in (q, k) for w in halves)

        # the first map: its output, out / (rstd s) + lam second, recovered a half at a time
        parts = [
            _flash_bwd(g, q1, k1, v[..., w], _first_output(out, second, lam, rstd * s, w),
                       lse1, 0.0, ctx.causal, **call)
            for g, w in zip(dx, halves)
        ]  # fmt: skip
        (dq1, dk1, dv_a), (dq1_b, dk1_b, dv_b) = parts
        dq1, dk1 = dq1.add_(dq1_b), dk1.add_(dk1_b)
        del parts, dq1_b, dk1_b
        # the second map, its gradient taken for dx and then scaled by -lam (the call is linear)
        dv = (dv_a, dv_b)
        del dv_a, dv_b
        dq2 = dk2 = None
        for i, w in enumerate(halves):
            gq, gk, gv = _flash_bwd(
                dx[i], q2, k2, v[..., w], second[..., w], lse2, 0.0, ctx.causal, **call
            )
            dx[i] = None  # both maps have read this half
            dv[i].addcmul_(gv, lam, value=-1)
            dq2, dk2 = (gq, gk) if dq2 is None else (dq2.add_(gq), dk2.add_(gk))
            del gq, gk, gv
        # each result as soon as its halves are joined, the halves freed
        dq = torch.cat((dq1, dq2.mul_(-lam)), -1)
        del dq1, dq2
        dk = torch.cat((dk1, dk2.mul_(-lam)), -1)
        del dk1, dk2
        return dq, dk, torch.cat(dv, -1), dlam, None, None, None


def _first_output(out: Tensor, second: Tensor, lam: Tensor, row_scale: Tensor, w: slice) -> Tensor:
    """Columns w of the first map's output, from the norm's output and the second map's: the
    difference is out / row_scale, and the first map's output the difference + lam second."""
    return (out[..., w] / row_scale).addcmul_(second[..., w], lam)


def _heads_inside(x: Tensor, width: int) -> Tensor:
    """An empty (b, h, n, width) tensor like x, laid out (b, n, h, width): the kernel's backward
    copies a gradient it is given in any other layout."""
    b, h, n, _ = x.shape
    return x.new_empty(b, n, h, width).transpose(1, 2)


def _inverse_rms(x: Tensor) -> Tensor:
    """1 / sqrt(mean(x^2) + eps) over the last dim, kept, computed in float32 for 16-bit x."""
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=compute_dtype(x.dtype))
    return (norm.square_() / x.shape[-1] + NORM_EPS).rsqrt_()
