"""Segments of a long call: whole chunks at a time, so what a kernel keeps per chunk (and its
backward recomputes) exists for one segment only, however long the sequence."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

# Tokens per segment: what a kernel keeps per chunk (scores, features, decays, states) exists
# for this many tokens at a time, so memory beyond the inputs, the output and their gradients
# is bounded by it, not by n.
SEGMENT_LENGTH = 512


def segments(n: int, chunk: int, length: int) -> list[tuple[int, int]]:
    """Static (start, stop) ranges of n tokens, each `length` tokens rounded down to whole chunks
    (at least one); the last may end mid-chunk. Computed from shapes only."""
    seg = chunk * max(1, length // chunk)
    return [(s, min(s + seg, n)) for s in range(0, max(n, 1), seg)]


def sliced(ts: tuple[Tensor | None, ...], start: int, stop: int) -> list[Tensor | None]:
    """Tokens [start, stop) of each (b, h, n, *) tensor; None stays None."""
    return [None if t is None else t[:, :, start:stop] for t in ts]


def put(dest: Tensor, part: Tensor) -> None:
    """Copy a segment's part into dest (b, h, L, *): the part as (b, h, L, *), or in whole chunks
    (b, h, nc, c, *) (a kernel's chunked layout, viewed) whose padding past L is dropped."""
    if part.dim() > dest.dim():  # one pass from the chunked layout: whole chunks, then the rest
        c = part.shape[3]
        whole, rest = divmod(dest.shape[2], c)
        dest[:, :, : whole * c].unflatten(2, (whole, c)).copy_(part[:, :, :whole])
        if rest:
            dest[:, :, whole * c :].copy_(part[:, :, whole, :rest])
        return
    dest.copy_(part)


def joined(part: Tensor, length: int) -> Tensor:
    """Whole chunks (b, h, nc, c, *) as (b, h, length, *), the padding past length dropped."""
    return part.flatten(2, 3)[:, :, :length]


def needs_grad(*tensors: Tensor | None) -> bool:
    """Whether a call on these tensors must record its backward: grad mode is on and one asks."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def forward_segments(
    segment: Callable[..., tuple[Tensor, Tensor, Tensor]],
    streams: Sequence[Tensor | None],
    state: Tensor,
    bounds: list[tuple[int, int]],
    out: Tensor,
) -> tuple[list[Tensor | None], Tensor]:
    """segment(*streams[s:e], state) -> (part, state, kept) over bounds in order, each part
    written into out[:, :, s:e] (`put`): what each segment kept for its backward (the state entering
    it, or more), and the final state."""
    kept = []
    for s, e in bounds:
        part, state, saved = segment(*sliced(tuple(streams), s, e), state)
        put(out[:, :, s:e], part)
        kept.append(saved)
        del part  # copied: not held while the next segment's is made
    return kept, state


def backward_segments(
    segment_grads: Callable[..., tuple[Tensor | None, ...]],
    streams: Sequence[Tensor | None],
    grad_out: Tensor,
    kept: list[Tensor | None],
    grad_state: Tensor,
    bounds: list[tuple[int, int]],
    grads: Sequence[Tensor | None],
) -> Tensor:
    """Last segment first, segment_grads(*streams[s:e], grad_out[s:e], what forward_segments kept
    for it, gradient of the state leaving) -> (*parts, gradient of the state entering); each
    part written into its whole-sequence buffer in grads (None: not wanted). Returns the first
    state's gradient."""
    for (s, e), start in zip(reversed(bounds), reversed(kept)):
        *parts, grad_state = segment_grads(*sliced((*streams, grad_out), s, e), start, grad_state)
        for grad, part in zip(grads, parts):
            if grad is not None:
                put(grad[:, :, s:e], part)
        del parts  # copied: not held while the next segment's are made
    return grad_state
