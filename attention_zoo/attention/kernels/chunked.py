"""Chunked window attention shared by `local` and `lsh`: padding, neighbour blocks, two kernels.

A sequence (already in chunk order: positions for `local`, hash-sorted positions for `lsh`) is cut
into chunks of `chunk` positions; each query chunk attends to its own chunk plus `before` previous
and `after` following chunks. Keys live in a "long" buffer: the flat sequence with `before` zero
chunks in front and `after` behind, so the key block at window offset o of every query chunk is one
plain view (`narrow` by o chunks); neighbours that do not exist (or belong to the previous row of
the flat batch) are masked by the caller's additive mask, never wrapped around.

The forward attends whole windows in one kernel call (keys as overlapping strided views, no copy).
LSH's backward runs one kernel call per window offset (and pass over sorted slots), so only one
offset's key/value gradients exist at a time: the flash backward of any partial, given the
combined output and combined log-sum-exp, returns exactly that partial's share of the combined
gradient (see `flash_backward_offset`). Local attention's backward needs no output at all (see
`patterns/window_grad.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from .cpu_flash import flash_backward, flash_forward
from .exp import exp_, logsumexp

# (window offset, out=None) -> additive float mask broadcastable to (B, H, c, c)
MaskFn = Callable[..., Tensor]


def padded_length(n: int, chunk: int) -> int:
    """Smallest multiple of `chunk` that is >= n (and >= chunk)."""
    return max(1, -(-n // chunk)) * chunk


def padded_qkv(q: Tensor, k: Tensor, v: Tensor, length: int) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v (b, h, n, d) zero-padded to `length` positions; shared QK (k is q) stays shared."""
    n = q.shape[2]
    if length == n:
        return q, k, v
    shared = k is q
    q, k, v = (torch.nn.functional.pad(t, (0, 0, 0, length - n)) for t in (q, k, v))
    return q, q if shared else k, v


@dataclass(frozen=True)
class Windows:
    """Geometry of one chunked pass: chunk size, neighbours, and how a flat buffer becomes blocks.

    to_heads maps blocks (B, rows, ...) of a flat (length, ...) buffer to the kernel's 4-D
    (B, H, rows, d) view: the flat buffer's trailing dims are (h, d) for local, (d,) for LSH.
    """

    chunk: int
    before: int
    after: int
    length: int  # flat length of the query sequence: rows x padded length
    to_heads: Callable[[Tensor], Tensor]

    def to_blocks(self, flat: Tensor) -> Tensor:
        """A flat (length, ...) slice as the kernel's (B, H, chunk, d) query blocks (a view)."""
        return self.to_heads(flat.view(-1, self.chunk, *flat.shape[1:]))

    @property
    def offsets(self) -> range:
        """Window offsets o: key chunk = query chunk - before + o."""
        return range(self.before + self.after + 1)

    @property
    def backward_order(self) -> list[int]:
        """Offsets with the own chunk first: its key blocks align with the queries."""
        return [self.before, *[o for o in self.offsets if o != self.before]]

    @property
    def width(self) -> int:
        """Keys in one query chunk's window: its own chunk and the neighbours."""
        return len(self.offsets) * self.chunk

    @property
    def front(self) -> int:
        return self.before * self.chunk

    @property
    def back(self) -> int:
        return self.after * self.chunk

    def keys(self, long: Tensor, o: int) -> Tensor:
        """The key (or value) block of every query chunk at window offset o: a view of `long`."""
        return self.to_blocks(long.narrow(0, o * self.chunk, self.length))

    def windows(self, long: Tensor, width: int) -> Tensor:
        """Every query chunk's whole key window (B, H, width, d): overlapping views of `long`."""
        span = long.narrow(0, 0, self.length - self.chunk + width)
        return self.to_heads(span.unfold(0, width, self.chunk).movedim(-1, 1))

    def new_long(self, like: Tensor, rest: tuple[int, ...]) -> tuple[Tensor, Tensor]:
        """A long buffer (front + length + back, *rest) with zeroed ends, and its middle view."""
        long = like.new_empty((self.front + self.length + self.back, *rest))
        long[: self.front].zero_()
        long[self.front + self.length :].zero_()
        return long, long.narrow(0, self.front, self.length)


@dataclass(frozen=True)
class RowWindows(Windows):
    """Windows of `rows` independent (b, h) sequences of `length // rows` slots each; a long
    buffer holds each row's slots with its neighbour chunks in front and behind."""

    rows: int = 1

    @property
    def row_length(self) -> int:
        return self.length // self.rows

    @property
    def long_length(self) -> int:
        return self.front + self.row_length + self.back

    def to_blocks(self, flat: Tensor) -> Tensor:
        """Flat (rows * row_length, d) queries as (rows, chunks, chunk, d) blocks (a view)."""
        return flat.view(self.rows, -1, self.chunk, flat.shape[-1])

    def keys(self, long: Tensor, o: int) -> Tensor:
        """The key block of every query chunk at window offset o: a view of `long`."""
        rows = long.view(self.rows, self.long_length, -1)
        return self.to_blocks(rows.narrow(1, o * self.chunk, self.row_length))

    def windows(self, long: Tensor, width: int) -> Tensor:
        """Every query chunk's whole key window (rows, chunks, width, d): overlapping views."""
        rows = long.view(self.rows, self.long_length, -1)
        return rows.unfold(1, width, self.chunk).movedim(-1, 2)


class Workspace:
    """Named scratch buffers reused across offsets and passes.

    A fresh multi-MiB CPU allocation is mmapped and page-faulted on first touch, so reusing
    same-shaped buffers saves real time; it never adds memory.
    """

    def __init__(self) -> None:
        self._buffers: dict[str, Tensor] = {}

    def clear(self) -> None:
        self._buffers.clear()

    def get(
        self, name: str, shape: tuple[int, ...], like: Tensor, dtype: torch.dtype | None = None
    ) -> Tensor:
        dtype = dtype or like.dtype
        buf = self._buffers.get(name)
        if buf is None or buf.shape != shape or buf.dtype != dtype:
            buf = like.new_empty(shape, dtype=dtype)
            self._buffers[name] = buf
        return buf


def _flash_fwd(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float
) -> tuple[Tensor, Tensor]:
    return flash_forward(q, k, v, 0.0, False, attn_mask=mask, scale=scale)


def flash_window_forward(
    q4: Tensor, k_long: Tensor, v_long: Tensor, win: Windows, mask: Tensor, scale: float
) -> tuple[Tensor, Tensor]:
    """One fused-kernel call over whole windows given their mask (B, H|1, c, W): (out, lse)."""
    width = mask.shape[-1]
    return _flash_fwd(q4, win.windows(k_long, width), win.windows(v_long, width), mask, scale)


def flash_backward_offset(
    o: int,
    g4: Tensor,
    q4: Tensor,
    k_long: Tensor,
    v_long: Tensor,
    out4: Tensor,
    lse_total: Tensor,
    win: Windows,
    masks: MaskFn,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk block, dv block) of window offset o, for a softmax combined over several partials.

    g4: gradient of the combined output; out4 / lse_total: the combined output and log-sum-exp
    over every partial (window offsets here, and hash rounds for LSH). Given the total lse, the
    kernel's probabilities exp(s - lse_total) are already the combined ones, and its
    rowsum(g4 * out4) is the combined softmax's; so each offset's call returns exactly its share
    of the combined gradient, with no per-partial weights.
    """
    return flash_backward(
        g4, q4, win.keys(k_long, o), win.keys(v_long, o), out4, lse_total,
        0.0, False, attn_mask=masks(o), scale=scale,
    )  # fmt: skip


def math_attention(
    q4: Tensor,
    k_long: Tensor,
    v_long: Tensor,
    win: Windows,
    masks: MaskFn,
    scale: float,
    dropout: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """Materialised blocks with plain autograd: (out (B, H, c, d), lse (B, H, c)).

    The reference implementation of the same computation (and the path on CUDA, and the one
    with attention dropout: probabilities zeroed with probability `dropout`, the rest scaled)."""
    scores = torch.cat(
        [
            torch.matmul(q4, win.keys(k_long, o).transpose(-1, -2)) * scale + masks(o)
            for o in win.offsets
        ],
        dim=-1,
    )  # (B, H, c, n_offsets * c)
    lse = logsumexp(scores, dim=-1, keepdim=True)
    probs = exp_(scores - lse)
    if dropout:
        probs = torch.nn.functional.dropout(probs, dropout)
    c = win.chunk
    out = sum(
        torch.matmul(probs[..., i * c : (i + 1) * c], win.keys(v_long, o))
        for i, o in enumerate(win.offsets)
    )
    return out, lse.squeeze(-1)
