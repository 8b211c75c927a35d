"""Chunked local attention (Reformer's LocalSelfAttention; Parmar et al. 2018, Kitaev et al. 2020).

The sequence is cut into chunks; each query attends to the keys of its own chunk plus
`num_chunks_before` previous and `num_chunks_after` following chunks (causally masked by position
when causal). Any length works: the sequence is padded to whole chunks and padding keys are masked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.autograd import Function

from .base import AttentionCore, mask_value
from .chunked import (
    Windows,
    check_chunking,
    flash_backward_offset,
    flash_forward,
    math_attention,
    padded_length,
    resolve_kernel,
)
from .spec import Capabilities, register_attention


@dataclass(frozen=True, kw_only=True)
class LocalConfig:
    """Options of chunked local attention."""

    chunk_length: int = 64  # positions per chunk
    num_chunks_before: int = 1  # previous chunks each query also sees
    num_chunks_after: int = 0  # following chunks each query also sees (ignored when causal)
    kernel: str = "auto"  # auto (flash on cpu/meta, else math), flash, math

    def __post_init__(self) -> None:
        check_chunking(
            "local", self.chunk_length, self.num_chunks_before, self.num_chunks_after, self.kernel
        )


def local_windows(b: int, h: int, n: int, d: int, cfg: LocalConfig, causal: bool) -> Windows:
    """Blocks (b * chunks, h, c, d) over a flat (b * npad, h, d) buffer, memory order (b, n, h, d).

    That order is the one a fused (b, n, 3 * h * d) input projection produces and the output
    projection consumes, so queries and outputs need no transposing copies.
    """
    c = cfg.chunk_length
    npad = padded_length(n, c)
    nc = npad // c
    after = 0 if causal else cfg.num_chunks_after  # later chunks are all in the future
    return Windows(
        chunk=c,
        before=cfg.num_chunks_before,
        after=after,
        length=b * npad,
        to_blocks=lambda x: x.view(b * nc, c, h, d).transpose(1, 2),
    )


def local_masks(
    win: Windows,
    b: int,
    n: int,
    *,
    causal: bool,
    key_padding_mask: Tensor | None,
    dtype: torch.dtype,
    device: torch.device,
):
    """Window offset -> additive mask (b * chunks, 1, c, c): missing/padding keys and the future."""
    c = win.chunk
    npad = win.length // b
    real = torch.arange(npad, device=device) < n  # (npad,)
    if key_padding_mask is not None:
        real = real & _pad_to(key_padding_mask, npad)
    # which keys exist, with the missing chunks before and after: (b | 1, front + npad + back)
    keys = torch.nn.functional.pad(real.expand(b, npad), (win.front, win.back), value=False)
    t = torch.arange(c, device=device)
    mv = mask_value(dtype)

    def mask(o: int, out: Tensor | None = None) -> Tensor:
        ok = keys[:, o * c : o * c + npad].reshape(b * (npad // c), 1, 1, c)
        if causal:  # key position - query position = (o - before) * c + u - t <= 0
            ok = ok & (((o - win.before) * c + t[None, :] - t[:, None]) <= 0)
        zero = torch.zeros((), dtype=dtype, device=device)
        return torch.where(ok, zero, torch.full((), mv, dtype=dtype, device=device), out=out)

    return mask


def _pad_to(key_padding_mask: Tensor, npad: int) -> Tensor:
    n = key_padding_mask.shape[1]
    return torch.nn.functional.pad(key_padding_mask, (0, npad - n), value=False)


def _flat(x: Tensor, npad: int) -> Tensor:
    """(b, h, n, d) -> flat (b * npad, h, d) in (b, n, h, d) order; a view when x is laid out so."""
    b, h, n, d = x.shape
    x = x.transpose(1, 2)
    if n < npad:
        x = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, npad - n))
    return x.reshape(b * npad, h, d)


def _unflat(x: Tensor, b: int, n: int) -> Tensor:
    """Flat (b * npad, h, d) -> (b, h, n, d) view."""
    _, h, d = x.shape
    return x.view(b, -1, h, d)[:, :n].transpose(1, 2)


class _LocalFlash(Function):
    """Local attention through the fused CPU kernel; backward through its backward op.

    Saves the three (padded) inputs, the output and its log-sum-exp; no score-sized tensor lives
    beyond one kernel call.
    """

    @staticmethod
    def forward(ctx, q, k, v, win, masks, scale, rows_may_be_empty):  # type: ignore[override]
        b, _, n, _ = q.shape
        npad = win.length // b
        q_flat = _flat(q, npad).contiguous()
        k_long, k_mid = win.new_long(q, tuple(q_flat.shape[1:]))
        v_long, v_mid = win.new_long(q, tuple(q_flat.shape[1:]))
        k_mid.copy_(_flat(k, npad))
        v_mid.copy_(_flat(v, npad))
        out4, lse = flash_forward(win.to_blocks(q_flat), k_long, v_long, win, masks, scale)
        keep = None
        if rows_may_be_empty:  # a query seeing no real key outputs zeros, not a neighbour's values
            keep = (lse > mask_value(q.dtype) / 2).unsqueeze(-1)
            out4.mul_(keep)
        ctx.save_for_backward(q_flat, k_long, v_long, out4, lse, keep)
        ctx.win, ctx.masks, ctx.scale, ctx.shape = win, masks, scale, (b, n)
        # out4 is (b * chunks, h, c, d) in (b, n, h, d) memory order
        return _unflat(out4.transpose(1, 2).reshape(win.length, *q_flat.shape[1:]), b, n)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        q_flat, k_long, v_long, out4, lse, keep = ctx.saved_tensors
        win, (b, n) = ctx.win, ctx.shape
        g4 = win.to_blocks(_flat(g, win.length // b))
        if keep is not None:
            g4 = g4 * keep
        dq = dk = dv = None
        q4 = win.to_blocks(q_flat)
        for o in win.backward_order:
            parts = flash_backward_offset(
                o, g4, q4, k_long, v_long, out4, lse, win, ctx.masks, ctx.scale
            )
            # kernel grads are (b, n, h, d) ordered: flatten to (b * npad, h, d) without copying
            dq_o, dk_o, dv_o = (t.transpose(1, 2).reshape(q_flat.shape) for t in parts)
            del parts
            if dq is None:  # the own-chunk offset: key blocks aligned with the sequence
                dq, dk, dv = dq_o, dk_o, dv_o
                continue
            dq.add_(dq_o)
            shift = (o - win.before) * win.chunk  # offset o's key block starts `shift` later
            _add_shifted(dk, dk_o, shift)
            _add_shifted(dv, dv_o, shift)
            del dq_o, dk_o, dv_o
        return _unflat(dq, b, n), _unflat(dk, b, n), _unflat(dv, b, n), None, None, None, None


def _add_shifted(acc: Tensor, part: Tensor, shift: int) -> None:
    """acc[i + shift] += part[i] where both ends are in range (the rest fell on padding)."""
    length = acc.shape[0]
    if shift < 0:
        acc[: length + shift].add_(part[-shift:])
    else:
        acc[shift:].add_(part[: length - shift])


@register_attention(
    "local",
    config=LocalConfig,
    caps=Capabilities(exact=False),
)
class LocalAttention(AttentionCore):
    """Chunked local attention: own chunk plus neighbour chunks; O(n * chunk) memory."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        b, h, n, d = q.shape
        cfg = self.cfg
        win = local_windows(b, h, n, d, cfg, self.causal)
        masks = local_masks(
            win,
            b,
            n,
            causal=self.causal,
            key_padding_mask=key_padding_mask,
            dtype=q.dtype,
            device=q.device,
        )
        scale = 1 / math.sqrt(d)
        if resolve_kernel(cfg.kernel, q.device, q.dtype) == "flash":
            return _LocalFlash.apply(q, k, v, win, masks, scale, key_padding_mask is not None)
        npad = win.length // b
        q4 = win.to_blocks(_flat(q, npad))
        pad = (0, 0, 0, 0, win.front, win.back)
        k_long = torch.nn.functional.pad(_flat(k, npad), pad)
        v_long = torch.nn.functional.pad(_flat(v, npad), pad)
        out4, lse = math_attention(q4, k_long, v_long, win, masks, scale)
        if key_padding_mask is not None:  # as the flash path: no real key to see -> zeros
            out4 = out4 * (lse > mask_value(q.dtype) / 2).unsqueeze(-1)
        return _unflat(out4.transpose(1, 2).reshape(win.length, h, d), b, n)
