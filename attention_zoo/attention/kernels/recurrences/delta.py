"""The delta rule (DeltaNet) and its gated form (Gated DeltaNet) in chunks: the WY/UT form.

S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T, o_t = scale S_t^T q_t (Yang et al. 2024,
"Parallelizing Linear Transformers with the Delta Rule over Sequence Length"; Yang et al. 2025,
"Gated Delta Networks"). Within a chunk the written values come from one unit lower-triangular
solve; only the state (b, h, dk, dv) crosses chunks.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor
from torch.nn import functional as F

from ..chunked import padded_length
from ..sums.plain import compute_dtype


def chunk_delta(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    log_decay: Tensor | None = None,
    *,
    scale: float,
    chunk_length: int = 64,
    initial_state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """q, k (b, h, n, dk), v (b, h, n, dv), beta and log_decay (<= 0) (b, h, n) -> o (b, h, n, dv)
    in q's dtype and the final state (b, h, dk, dv) in float32 for 16-bit inputs."""
    b, h, n, dk = k.shape
    dv = v.shape[-1]
    dtype, wide = q.dtype, compute_dtype(q.dtype)
    c = min(chunk_length, n)  # a short call (a decode step) is one chunk of its own length
    # (b h nc) c d: the chunks of every head as one batch of small matrices; padding keys and
    # beta with zeros writes nothing, log_decay = 0 keeps the state as it is
    q, k, v, beta = (_chunks(t.to(wide), c) for t in (q, k, v, beta[..., None]))
    q = q * scale
    decay = None if log_decay is None else _chunks(log_decay[..., None].to(wide), c)[..., 0]
    nc = q.shape[0] // (b * h)
    state = k.new_zeros(b, h, dk, dv) if initial_state is None else initial_state.to(wide)

    parts = _within_chunks(q, k, v, beta, decay)
    starts = _chunk_starts(parts, state.flatten(0, 1), nc)  # (b h nc) dk dv
    u = torch.baddbmm(parts.values, parts.writes_from_start, starts, alpha=-1)
    o = torch.baddbmm(parts.queries @ starts, parts.scores, u)  # (b h nc) c dv
    o = o.unflatten(0, (b, h, nc)).flatten(2, 3)[:, :, :n]
    # the last chunk's update, which the scan over chunk starts leaves out
    last = starts[nc - 1 :: nc]
    last = last if parts.decay is None else last * parts.decay[nc - 1 :: nc]
    final = torch.baddbmm(last, parts.keys_to_end[nc - 1 :: nc].mT, u[nc - 1 :: nc])
    return o.to(dtype), final.unflatten(0, (b, h))


def _chunks(x: Tensor, c: int) -> Tensor:
    """(b, h, n, d) -> ((b h nc), c, d), zero-padded to whole chunks."""
    pad = padded_length(x.shape[-2], c) - x.shape[-2]
    if pad:
        x = F.pad(x, (0, 0, 0, pad))
    return x.unflatten(-2, (-1, c)).flatten(0, 2)


class _Chunks(NamedTuple):
    """Every chunk's part of the recurrence that does not depend on the incoming state S, as
    ((b h nc), c, *) tensors: the chunk's outputs are queries S + scores (values - W S), with
    W = writes_from_start, and its final state is decay (I - keys^T writes) S + keys_to_end^T
    (values - W S)."""

    queries: Tensor  # scale q, decayed from the chunk's start
    keys: Tensor
    keys_to_end: Tensor  # decayed to the chunk's end
    scores: Tensor  # (B, c, c): causal, decayed query-key products
    values: Tensor  # U: the values the chunk writes from a zero state
    writes: Tensor  # W: how the written values depend on the state (without decays)
    writes_from_start: Tensor  # W decayed from the chunk's start
    decay: Tensor | None  # (B, 1, 1): the whole chunk's decay


def _within_chunks(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, decay: Tensor | None) -> _Chunks:
    """The UT transform of every chunk at once, from (B, c, *) inputs: with A = strictly-lower(
    diag(beta) K K^T * decays), (I + A) U = diag(beta) V; W solves the same system without decays
    (decays scale W's rows, so W never holds their products: no subnormal numbers)."""
    c = k.shape[-2]
    causal = torch.ones(c, c, dtype=torch.bool, device=k.device).tril()
    k_beta, v_beta = k * beta, v * beta
    lower = k_beta @ k.mT  # only the strictly lower part is read
    scores = q @ k.mT
    if decay is None:
        solved = torch.linalg.solve_triangular(
            lower, torch.cat([v_beta, k_beta], dim=-1), upper=False, unitriangular=True
        )
        values, writes = solved.split([v.shape[-1], k.shape[-1]], dim=-1)
        scores = scores.masked_fill_(~causal, 0)
        return _Chunks(q, k, k, scores, values, writes, writes, None)
    cum = decay.cumsum(-1)  # (B, c): log of the decay from the chunk's start
    # exp(c_i - c_j) only where i >= j (<= 0 there): never the exponential of a positive sum
    gaps = _exp_decay((cum[:, :, None] - cum[:, None, :]).masked_fill_(~causal, -torch.inf))
    values = torch.linalg.solve_triangular(lower * gaps, v_beta, upper=False, unitriangular=True)
    writes = torch.linalg.solve_triangular(lower, k_beta, upper=False, unitriangular=True)
    last = cum[:, -1:]  # (B, 1)
    from_start = _exp_decay(cum)[..., None]
    return _Chunks(
        queries=q * from_start,
        keys=k,
        keys_to_end=k * _exp_decay(last - cum)[..., None],
        scores=scores * gaps,
        values=values,
        writes=writes,
        writes_from_start=writes * from_start,
        decay=_exp_decay(last)[..., None],
    )


def _exp_decay(log_decay: Tensor) -> Tensor:
    """exp of log decays (<= 0), zero below the square root of the smallest normal number: their
    products with O(1) numbers would be subnormal, where CPU arithmetic is many times slower."""
    floor = math.log(torch.finfo(log_decay.dtype).tiny) / 2
    return log_decay.masked_fill(log_decay < floor, -torch.inf).exp_()


def _chunk_starts(parts: _Chunks, state: Tensor, nc: int) -> Tensor:
    """The state entering each chunk, ((b h nc), dk, dv): across a chunk the state maps
    affinely, S' = a (I - K^T W) S + K_end^T U, so the loop over chunks is one matmul each."""
    if nc == 1:
        return state

    def but_last(t: Tensor) -> Tensor:  # the last chunk's map is not needed
        return t.unflatten(0, (-1, nc))[:, :-1].flatten(0, 1)

    eye = torch.eye(parts.keys.shape[-1], dtype=state.dtype, device=state.device)
    maps = torch.baddbmm(eye, but_last(parts.keys).mT, but_last(parts.writes), alpha=-1)
    if parts.decay is not None:
        maps = maps * but_last(parts.decay)
    shifts = but_last(parts.keys_to_end).mT @ but_last(parts.values)
    # unbind, not indexing: indexing in the loop makes the backward zero-fill a full-size
    # gradient per chunk
    starts = [state]
    for m, s in zip(
        maps.unflatten(0, (-1, nc - 1)).unbind(1), shifts.unflatten(0, (-1, nc - 1)).unbind(1)
    ):
        starts.append(torch.baddbmm(s, m, starts[-1]))
    return torch.stack(starts, dim=1).flatten(0, 1)
