"""The fused local-attention kernel: window geometry over the (b, n, h, d) layout, masks, and the
autograd Function (fused forward, backward from the saved log-sum-exp via `window_grad`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.autograd import Function

from ..backward import hand_written_backward
from ..chunked import Windows, flash_window_forward, padded_length
from ..masks import additive_mask, mask_value, real_positions
from .window_grad import window_backward


def local_windows(b: int, n: int, chunk: int, before: int, after: int) -> Windows:
    """Blocks (b * chunks, h, c, d) over a flat (b * npad, h, d) buffer, memory order (b, n, h, d).

    That order is the one the (b, n, h * d) input projections produce and the output projection
    consumes, so queries and outputs need no transposing copies.
    """
    return Windows(
        chunk=chunk,
        before=before,
        after=after,
        length=b * padded_length(n, chunk),
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
        ok = exists[first : first + count, None, None, :] & self.allowed
        return additive_mask(ok, self.dtype)

    def __call__(self, o: int, out: Tensor | None = None) -> Tensor:
        c, (rows, length) = self.chunk, self.keys.shape
        npad = length - self.allowed.shape[1] + c  # the keys buffer has the window's extra chunks
        exists = self.keys[:, o * c : o * c + npad].reshape(rows * (npad // c), 1, 1, c)
        return additive_mask(exists & self.allowed[:, o * c : (o + 1) * c], self.dtype, out)


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
    real = real_positions(n, npad, key_padding_mask, device)  # (b | 1, npad)
    # which keys exist, with the missing chunks before and after: (b | 1, front + npad + back)
    keys = torch.nn.functional.pad(real.expand(b, npad), (win.front, win.back), value=False)
    allowed = torch.ones((c, win.width), dtype=torch.bool, device=device)
    if causal:  # key position - query position = w - before * c - t <= 0
        t = torch.arange(c, device=device)
        allowed = (torch.arange(win.width, device=device)[None, :] - win.front - t[:, None]) <= 0
    return LocalMasks(keys, allowed, c, dtype)


def flat(x: Tensor, npad: int) -> Tensor:
    """(b, h, n, d) -> flat (b * npad, h, d) in (b, n, h, d) order; a view when x is laid out so."""
    b, h, n, d = x.shape
    x = x.transpose(1, 2)
    if n < npad:
        x = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, npad - n))
    return x.reshape(b * npad, h, d)


def unflat(x: Tensor, b: int, n: int) -> Tensor:
    """Flat (b * npad, h, d) -> (b, h, n, d) view."""
    _, h, d = x.shape
    return x.view(b, -1, h, d)[:, :n].transpose(1, 2)


class LocalFlash(Function):
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
        q_flat = flat(q, npad)
        if q_flat.stride(-1) != 1:  # the fused kernel reads rows as dense vectors
            q_flat = q_flat.contiguous()
        k_long, k_mid = win.new_long(q, (h, d))  # keys with zero chunks at both ends
        v_long, v_mid = win.new_long(q, (h, d))
        k_mid.copy_(flat(k, npad))
        v_mid.copy_(flat(v, npad))
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
        return unflat(out4.transpose(1, 2).reshape(win.length, h, d), b, n)

    @staticmethod
    @hand_written_backward
    def backward(ctx, g):  # type: ignore[override]
        q, k, v, lse, keep = ctx.saved_tensors  # (b, h, n, d), or flat padded (b * npad, h, d)
        win, (b, n) = ctx.win, ctx.shape
        npad = win.length // b
        inputs = (q, k, v) if ctx.padded else (flat(t, npad) for t in (q, k, v))
        grads = window_backward(flat(g, npad), *inputs, lse, win, ctx.masks.window, ctx.scale, keep)
        return (*(unflat(t, b, n) for t in grads), None, None, None, None)


def chunk_windows(
    q: Tensor,
    chunk: int,
    before: int,
    after: int,
    causal: bool,
    key_padding_mask: Tensor | None,
) -> tuple[Windows, LocalMasks]:
    """The fused kernels' windows over q's (b, h, n, d) geometry, and their masks."""
    b, n = q.shape[0], q.shape[2]
    win = local_windows(b, n, chunk, before, after)
    masks = local_masks(
        win,
        b,
        n,
        causal=causal,
        key_padding_mask=key_padding_mask,
        dtype=q.dtype,
        device=q.device,
    )
    return win, masks
