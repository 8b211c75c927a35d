"""Segments of a long call: whole chunks at a time, so what a kernel keeps per chunk (and its
backward recomputes) exists for one segment only, however long the sequence."""

from __future__ import annotations

from torch import Tensor


def segments(n: int, chunk: int, length: int) -> list[tuple[int, int]]:
    """Static (start, stop) ranges of n tokens, each `length` tokens rounded down to whole chunks
    (at least one); the last may end mid-chunk. Computed from shapes only."""
    seg = chunk * max(1, length // chunk)
    return [(s, min(s + seg, n)) for s in range(0, max(n, 1), seg)]


def sliced(ts: tuple[Tensor | None, ...], start: int, stop: int) -> list[Tensor | None]:
    """Tokens [start, stop) of each (b, h, n, *) tensor; None stays None."""
    return [None if t is None else t[:, :, start:stop] for t in ts]
