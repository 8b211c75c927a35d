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
    flash_window_forward,
    math_attention,
    padded_length,
    resolve_kernel,
)
from .spec import Capabilities, register_attention
from .window_grad import window_backward


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

    That order is the one the (b, n, h * d) input projections produce and the output projection
    consumes, so queries and outputs need no transposing copies.
    """
    c = cfg.chunk_length
    npad = padded_length(n, c)
    after = 0 if causal else cfg.num_chunks_after  # later chunks are all in the future
    return Windows(
        chunk=c,
        before=cfg.num_chunks_before,
        after=after,
        length=b * npad,
        to_heads=lambda x: x.transpose(1, 2),
    )


@dataclass(frozen=True)
class LocalMasks:
    """Additive masks of local attention: missing/padding keys and, when causal, the future.

    `window(first, count)` covers the whole key windows of query chunks first:first+count, as
    (count, 1, c, W); calling it with a window offset o gives that offset's (chunks, 1, c, c)
    block, the per-offset form the materialised path takes.
    """

    keys: Tensor  # (b, front + npad + back) bool: which key positions exist
    allowed: Tensor  # (c, W) bool: allowed by position within every window
    chunk: int
    dtype: torch.dtype

    def window(self, first: int, count: int) -> Tensor:
        exists = self.keys.unfold(1, self.allowed.shape[1], self.chunk).flatten(0, 1)
        return self._additive(exists[first : first + count, None, None, :] & self.allowed)

    def __call__(self, o: int, out: Tensor | None = None) -> Tensor:
        c, (rows, length) = self.chunk, self.keys.shape
        npad = length - self.allowed.shape[1] + c  # the keys buffer has the window's extra chunks
        exists = self.keys[:, o * c : o * c + npad].reshape(rows * (npad // c), 1, 1, c)
        return self._additive(exists & self.allowed[:, o * c : (o + 1) * c], out)

    def _additive(self, ok: Tensor, out: Tensor | None = None) -> Tensor:
        """0 where allowed, the dtype's mask value elsewhere."""
        zero = torch.zeros((), dtype=self.dtype, device=ok.device)
        low = torch.full((), mask_value(self.dtype), dtype=self.dtype, device=ok.device)
        return torch.where(ok, zero, low, out=out)


def local_masks(
    win: Windows,
    b: int,
    n: int,
    *,
    causal: bool,
    key_padding_mask: Tensor | None,
    dtype: torch.dtype,
    device: torch.device,
) -> LocalMasks:
    """Masks for a (b * npad) flat sequence of real length n per row."""
    c = win.chunk
    npad = win.length // b
    real = torch.arange(npad, device=device) < n  # (npad,)
    if key_padding_mask is not None:
        real = real & _pad_to(key_padding_mask, npad)
    # which keys exist, with the missing chunks before and after: (b | 1, front + npad + back)
    keys = torch.nn.functional.pad(real.expand(b, npad), (win.front, win.back), value=False)
    allowed = torch.ones((c, win.width), dtype=torch.bool, device=device)
    if causal:  # key position - query position = w - before * c - t <= 0
        t = torch.arange(c, device=device)
        allowed = (torch.arange(win.width, device=device)[None, :] - win.front - t[:, None]) <= 0
    return LocalMasks(keys, allowed, c, dtype)


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
    """Local attention through the fused CPU kernel; backward from the saved log-sum-exp.

    Saves only the inputs and the log-sum-exp: as given when they are views in (b, n, h, d)
    order, as SelfAttention's projections produce (no copies), else the flat copies the forward
    makes anyway. The backward (see `window_grad`) needs neither the output nor full-size scratch.
    """

    @staticmethod
    def forward(ctx, q, k, v, win, masks, scale, rows_may_be_empty):  # type: ignore[override]
        b, h, n, d = q.shape
        npad = win.length // b
        # a view when q is (b, n, h, d)-ordered and n a whole number of chunks, else a copy
        q_flat = _flat(q, npad)
        if q_flat.stride(-1) != 1:  # the fused kernel reads rows as dense vectors
            q_flat = q_flat.contiguous()
        k_long, k_mid = win.new_long(q, (h, d))  # keys with zero chunks at both ends
        v_long, v_mid = win.new_long(q, (h, d))
        k_mid.copy_(_flat(k, npad))
        v_mid.copy_(_flat(v, npad))
        chunks = win.length // win.chunk
        out4, lse = flash_window_forward(
            win.to_blocks(q_flat), k_long, v_long, win, masks.window(0, chunks), scale
        )
        keep = None
        if rows_may_be_empty:  # a query seeing no real key outputs zeros, not a neighbour's values
            keep = (lse > mask_value(q.dtype) / 2).unsqueeze(-1).to(q.dtype)
            out4.mul_(keep)
        # save the inputs as given or, when padding made copies anyway, the padded copies (the
        # originals are then freed)
        ctx.padded = npad != n
        inputs = (q_flat, k_mid, v_mid) if ctx.padded else (q, k, v)
        del k_long, v_long
        ctx.save_for_backward(*inputs, lse, keep)
        ctx.win, ctx.masks, ctx.scale, ctx.shape = win, masks, scale, (b, n)
        # out4 is (b * chunks, h, c, d) in (b, n, h, d) memory order
        return _unflat(out4.transpose(1, 2).reshape(win.length, h, d), b, n)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        q, k, v, lse, keep = ctx.saved_tensors  # (b, h, n, d), or flat padded (b * npad, h, d)
        win, (b, n) = ctx.win, ctx.shape
        npad = win.length // b
        flat = [_flat(g, npad), *((q, k, v) if ctx.padded else (_flat(t, npad) for t in (q, k, v)))]
        grads = window_backward(*flat, lse, win, ctx.masks.window, ctx.scale, keep)
        return (*(_unflat(t, b, n) for t in grads), None, None, None, None)


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
