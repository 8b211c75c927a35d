"""Backward of chunked window attention that needs neither the output nor any full-size scratch.

The fused kernel's backward takes the forward output (for D = rowsum(dO * O)) and returns fresh
gradient tensors per call, so it keeps inputs, output, incoming gradient and two sets of
gradients alive at once. This backward recomputes each segment's probabilities from the saved
log-sum-exp, takes D as rowsum(P * dP) (equal to rowsum(dO * O), without O), and adds each
segment's gradients into one set of accumulators: its peak is the inputs, the incoming gradient,
the three gradients and a few MiB of per-segment scratch. The segment loop runs in backward
only; each segment's work is batched over its chunks and heads.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor

from ..chunked import Windows
from ..exp import exp_

# Per-segment scratch the backward aims for: its score blocks, windows and partial gradients.
SEGMENT_SCRATCH_BYTES = 6 << 20
SEGMENTS = 8  # a segment holds at most 1/SEGMENTS of the chunks (rounded up)

# (first chunk, number of chunks) -> additive mask (chunks, 1, c, W) over each chunk's key window
WindowMask = Callable[[int, int], Tensor]


def _chunks_per_segment(win: Windows, heads: int, head_dim: int, itemsize: int) -> int:
    """Query chunks per segment whose `_Scratch` fits in SEGMENT_SCRATCH_BYTES."""
    c, w, d = win.chunk, win.width, head_dim
    # per (chunk, head): three score blocks (c, W), key and value windows (W, d), three (c, d)
    per_chunk = heads * (3 * c * w + 2 * w * d + 3 * c * d) * itemsize
    return max(1, SEGMENT_SCRATCH_BYTES // per_chunk)


def _blocks_into(buf: Tensor, flat: Tensor, first: int, count: int, c: int) -> Tensor:
    """Chunks first:first+count of a flat (length, h, d) buffer, copied into buf (count*h, c, d)."""
    _, h, d = flat.shape
    part = flat.narrow(0, first * c, count * c).view(count, c, h, d)
    buf.view(count, h, c, d).copy_(part.transpose(1, 2))
    return buf


def _key_windows_into(buf: Tensor, flat: Tensor, first: int, count: int, win: Windows) -> Tensor:
    """Each query chunk's key window into buf (count*h, W, d); zeros where it leaves the buffer."""
    c, (length, h, d) = win.chunk, flat.shape
    lo, hi = (first - win.before) * c, (first + count + win.after) * c
    if lo >= 0 and hi <= length:
        rows = flat.narrow(0, lo, hi - lo)
    else:  # the window reaches past an end: zero rows there (their keys are masked)
        rows = flat.new_zeros((hi - lo, h, d))
        rows[max(0, -lo) : hi - lo - max(0, hi - length)] = flat[max(lo, 0) : min(hi, length)]
    windows = rows.unfold(0, win.width, c)  # (count, h, d, W): overlapping views, no copy
    buf.view(count, h, win.width, d).copy_(windows.permute(0, 1, 3, 2))
    return buf


def _add_windows(acc: Tensor, grads: Tensor, first: int, count: int, win: Windows) -> None:
    """acc (length, h, d) += window gradients (count * h, W, d), each at its key positions."""
    c, (length, h, d) = win.chunk, acc.shape
    per = grads.view(count, h, len(win.offsets), c, d)
    for o in win.offsets:  # window offsets: a handful, each one strided add
        start = first - win.before + o  # key chunk of query chunk `first` at offset o
        lo, hi = max(start, 0), min(start + count, length // c)
        if lo < hi:
            dst = acc.narrow(0, lo * c, (hi - lo) * c).view(hi - lo, c, h, d)
            dst.add_(per[lo - start : hi - start, :, o].transpose(1, 2))


class _Scratch:
    """A segment's buffers, allocated once for the largest segment and reused by all (a fresh
    multi-MiB CPU allocation costs page faults on first touch; reuse costs nothing)."""

    def __init__(
        self, like: Tensor, dtype: torch.dtype, rows: int, c: int, width: int, d: int
    ) -> None:
        new = functools.partial(like.new_empty, dtype=dtype)
        self._chunk_rows = [new((rows, c, d)) for _ in range(3)]  # queries, grads, dq
        self._window_rows = [new((rows, width, d)) for _ in range(2)]  # keys, values
        self._scores = [new((rows, c, width)) for _ in range(3)]  # p, dp, p * dp

    def take(self, rows: int) -> tuple[Tensor, ...]:
        """(q, g, out, k, v, p, dp, tmp) for a segment of `rows` (chunk, head) blocks."""
        return tuple(b[:rows] for b in (*self._chunk_rows, *self._window_rows, *self._scores))


def window_backward(
    g: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    lse: Tensor,
    win: Windows,
    window_mask: WindowMask,
    scale: float,
    keep: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) as flat (length, h, d) tensors, for outputs softmax(q k^T * scale + mask) v.

    g, q, k, v: flat (length, h, d) in chunk order (views are fine); lse: (chunks, h, c), the
    forward's log-sum-exp; keep: optional (chunks, h, c, 1) 0/1 factor the forward applied to
    its outputs (queries that saw no real key).
    """
    c, w, (length, h, d) = win.chunk, win.width, q.shape
    chunks = length // c
    dq = q.new_empty((length, h, d))
    dk, dv = q.new_zeros((length, h, d)), q.new_zeros((length, h, d))
    # segments within the scratch budget and of at most 1/SEGMENTS of the chunks, so that short
    # sequences keep their scratch small too
    # 16-bit inputs: each segment's arithmetic runs in float32 (the forward kernel's lse is)
    work = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    itemsize = torch.empty((), dtype=work).element_size()
    most = min(-(-chunks // SEGMENTS), _chunks_per_segment(win, h, d, itemsize))
    step = -(-chunks // -(-chunks // most))  # equal segments of at most `most` chunks
    scratch = _Scratch(q, work, step * h, c, w, d)
    for first in range(0, chunks, step):
        count = min(step, chunks - first)
        rows = count * h
        q_buf, g_buf, out_buf, k_buf, v_buf, p_buf, dp_buf, tmp_buf = scratch.take(rows)
        qs = _blocks_into(q_buf, q, first, count, c)
        gs = _blocks_into(g_buf, g, first, count, c)
        if keep is not None:
            gs.mul_(keep[first : first + count].reshape(rows, c, 1))
        kw = _key_windows_into(k_buf, k, first, count, win)
        # probabilities from the saved log-sum-exp
        p = torch.bmm(qs, kw.transpose(1, 2), out=p_buf).view(count, h, c, w)
        p.mul_(scale).add_(window_mask(first, count))
        p = exp_(p.sub_(lse[first : first + count].unsqueeze(-1))).view(rows, c, w)
        vw = _key_windows_into(v_buf, v, first, count, win)
        dp = torch.bmm(gs, vw.transpose(1, 2), out=dp_buf)
        _add_windows(dv, torch.bmm(p.transpose(1, 2), gs, out=vw), first, count, win)
        delta = torch.mul(p, dp, out=tmp_buf).sum(-1, keepdim=True)  # rowsum(dO * O), sans O
        ds = dp.sub_(delta).mul_(p)
        dq_blocks = torch.bmm(ds, kw, out=out_buf).mul_(scale).view(count, h, c, d)
        dq.narrow(0, first * c, count * c).view(count, c, h, d).copy_(dq_blocks.transpose(1, 2))
        dkw = torch.bmm(ds.transpose(1, 2), qs, out=kw).mul_(scale)
        _add_windows(dk, dkw, first, count, win)
    return dq, dk, dv
