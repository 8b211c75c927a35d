"""Differential attention's fused CPU kernel: both softmax maps, their difference and the per-head
RMSNorm in one autograd Function that keeps the output, the second map's output and the two
log-sum-exps for its backward, and nothing the size of the keys.

The forward runs PyTorch's fused CPU kernel once per map, keys with the other half zeroed (q . [k1,
0] = q1 . k1: the kernel wants one width for q, k and v). The backward runs it on square tiles of
(query rows, key rows), at and below the diagonal when causal: given a map's whole output and
log-sum-exp, a tile's call returns exactly its share of the map's gradient (as
chunked.flash_backward_offset's partials do), so only a tile's zero-padded keys and gradients
exist at a time, added into q's, k's and v's. The first map's output is recovered from the norm's
output and the second map's, a tile of rows at a time, so it is never saved.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor
from torch.autograd import Function

from .backward import hand_written_backward
from .cpu_flash import flash_backward, flash_forward
from .masks import additive_mask, real_keys_mask
from .sums.plain import compute_dtype

NORM_EPS = 1e-5  # the per-head RMSNorm's, as the paper's code
TILES = 8  # the backward's query (and key) tiles per sequence
TILE_MIN = 256  # rows of a tile at the least: shorter ones cost more in calls than they save


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
        mask = additive_mask(real_keys_mask(key_padding_mask), q.dtype)
    # the fused kernel reads rows as dense vectors
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    return DifferentialFlash.apply(q, k, v, lam.to(q.dtype), mask, causal, out_scale)


class DifferentialFlash(Function):
    """Saves q, k, v, lambda, the output, the second map's output, the row scales and the two
    log-sum-exps; see the module docstring for the tiled backward."""

    @staticmethod
    def forward(ctx, q, k, v, lam, mask, causal, out_scale):  # type: ignore[override]
        d = q.shape[-1]
        first = torch.arange(d, device=q.device) < d // 2
        call = dict(attn_mask=mask, scale=(d // 2) ** -0.5)
        out, lse1 = flash_forward(q, k * first, v, 0.0, causal, **call)
        second, lse2 = flash_forward(q, k * ~first, v, 0.0, causal, **call)
        out.addcmul_(second, lam, value=-1)  # the difference, in the first map's buffer
        rstd = _inverse_rms(out)
        out.mul_((rstd * out_scale).to(out.dtype))
        ctx.save_for_backward(q, k, v, lam, mask, out, second, rstd, lse1, lse2)
        ctx.causal, ctx.out_scale = causal, out_scale
        return out

    @staticmethod
    @hand_written_backward
    def backward(ctx, grad):  # type: ignore[override]
        q, k, v, lam, mask, out, second, rstd, lse1, lse2 = ctx.saved_tensors
        d, s, n = q.shape[-1], ctx.out_scale, q.shape[2]
        half = d // 2
        rstd = rstd.to(q.dtype)
        # the norm's backward, dx = rstd (s g - out (g . out) / (s d)), laid out as the kernel
        # reads gradients
        across = -rstd * torch.linalg.vecdot(grad, out).unsqueeze(-1) / (s * d)
        dx = _heads_inside(out, d).copy_(out).mul_(across).addcmul_(grad, rstd * s)
        dlam = -torch.linalg.vecdot(dx, second).sum()
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        first = torch.arange(d, device=q.device) < half
        maps = ((first, lse1, slice(0, half)), (~first, lse2, slice(half, d)))
        for m, (keys_half, lse, w) in enumerate(maps):
            for rows, key_tiles in _tiles(n, _tile_rows(n), ctx.causal):
                if m == 0:  # the first map's output, recovered from the norm's and the second's
                    o = (out[:, :, rows] / (rstd[:, :, rows] * s)).addcmul_(second[:, :, rows], lam)
                else:
                    o = second[:, :, rows]
                for cols, causal in key_tiles:
                    keys_mask = None if mask is None else mask[..., cols]
                    gq, gk, gv = flash_backward(
                        dx[:, :, rows], q[:, :, rows], k[:, :, cols] * keys_half, v[:, :, cols],
                        o, lse[:, :, rows], 0.0, causal, attn_mask=keys_mask, scale=half**-0.5,
                    )  # fmt: skip
                    # padded keys: q's gradient is 0 outside the map's half, k's there is not
                    # its own
                    dq[:, :, rows, w] += gq[..., w]
                    dk[:, :, cols, w] += gk[..., w]
                    if m == 0:
                        dv[:, :, cols] += gv
                    else:
                        dv[:, :, cols].addcmul_(gv, lam, value=-1)
                    del gq, gk, gv
                del o
        dq[..., half:] *= -lam  # the second map's gradient, taken for dx, scaled by -lam
        dk[..., half:] *= -lam
        return dq, dk, dv, dlam, None, None, None


def _tile_rows(n: int) -> int:
    """Rows of the backward's square tiles: an eighth of the sequence (at least TILE_MIN), so
    a tile's gradients and inputs stay a small share of the full tensors."""
    return max(TILE_MIN, -(-n // TILES))


def _tiles(n: int, rows: int, causal: bool) -> Iterator[tuple[slice, list[tuple[slice, bool]]]]:
    """Each tile of query rows with its tiles of key rows and whether a call on them is causal:
    causal, only those at or below the diagonal, the diagonal one causal (the kernel aligns a
    square tile's first query and key)."""
    for qs in range(0, n, rows):
        keys = range(0, qs + rows if causal else n, rows)
        yield (
            slice(qs, min(qs + rows, n)),
            [(slice(ks, min(ks + rows, n)), causal and ks == qs) for ks in keys],
        )


def _heads_inside(x: Tensor, width: int) -> Tensor:
    """An empty (b, h, n, width) tensor like x, laid out (b, n, h, width): the kernel's backward
    copies a gradient it is given in any other layout."""
    b, h, n, _ = x.shape
    return x.new_empty(b, n, h, width).transpose(1, 2)


def _inverse_rms(x: Tensor) -> Tensor:
    """1 / sqrt(mean(x^2) + eps) over the last dim, kept, computed in float32 for 16-bit x."""
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=compute_dtype(x.dtype))
    return (norm.square_() / x.shape[-1] + NORM_EPS).rsqrt_()
