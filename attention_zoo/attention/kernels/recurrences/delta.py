"""The delta rule (DeltaNet) and its gated form (Gated DeltaNet) in chunks: the WY/UT form.

S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T, o_t = scale S_t^T q_t (Yang et al. 2024,
"Parallelizing Linear Transformers with the Delta Rule over Sequence Length"; Yang et al. 2025,
"Gated Delta Networks"). Within a chunk the written values come from unit lower-triangular
solves; only the state (b, h, dk, dv) crosses chunks, one matmul per chunk.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor
from torch.nn import functional as F

from ..chunked import padded_length
from ..exp import exp_
from ..segments import segments, sliced
from ..sums.plain import compute_dtype
from .reference import l2_normalised

# Tokens per segment: a longer call runs segment by segment, forward without autograd, and its
# backward recomputes one segment at a time, so the activations autograd keeps (a dozen tensors
# the size of q) exist for one segment only, and stay in cache.
SEGMENT_LENGTH = 512


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
    normalise_qk: bool = False,
) -> tuple[Tensor, Tensor]:
    """q, k (b, h, n, dk), v (b, h, n, dv), beta and log_decay (<= 0) (b, h, n) -> o (b, h, n, dv)
    in q's dtype and the final state (b, h, dk, dv) in float32 for 16-bit inputs. normalise_qk:
    q and k L2-normalised a segment at a time (never a whole normalised copy kept for backward)."""
    b, h, n, dk = k.shape
    wide = compute_dtype(q.dtype)
    state = (
        k.new_zeros(b, h, dk, v.shape[-1], dtype=wide) if initial_state is None else initial_state
    )
    setup = (scale, chunk_length, normalise_qk)
    if n == 1:
        return delta_step(
            q, k, v, beta, log_decay, scale=scale, state=state, normalise_qk=normalise_qk
        )
    bounds = segments(n, chunk_length, SEGMENT_LENGTH)
    if len(bounds) == 1:
        return _segment(q, k, v, beta, log_decay, state, *setup)
    return _Segments.apply(q, k, v, beta, log_decay, state, setup, bounds)


def delta_step(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    log_decay: Tensor | None = None,
    *,
    scale: float,
    state: Tensor,
    normalise_qk: bool = False,
) -> tuple[Tensor, Tensor]:
    """One token (a decode step): q, k (b, h, 1, dk), v (b, h, 1, dv), beta, log_decay (b, h, 1),
    state (b, h, dk, dv) -> o (b, h, 1, dv), the new state; chunk_delta's result, in fewer ops."""
    dtype, wide = q.dtype, compute_dtype(q.dtype)
    q, k, v, beta, state = (t.to(wide) for t in (q, k, v, beta, state))
    if normalise_qk:
        q, k = l2_normalised(q), l2_normalised(k)
    if log_decay is not None:
        state = state * _exp_decay(log_decay.to(wide))[..., None]
    error = (v - k @ state) * beta[..., None]  # (b, h, 1, dv)
    state = torch.baddbmm(state.flatten(0, 1), k.flatten(0, 1).mT, error.flatten(0, 1))
    state = state.unflatten(0, k.shape[:2])
    return ((q * scale) @ state).to(dtype), state


class _Segments(torch.autograd.Function):
    """chunk_delta a segment at a time; the backward recomputes each segment's forward with
    autograd, from the state saved at its start, last segment first."""

    @staticmethod
    def forward(ctx, q, k, v, beta, log_decay, state, setup, bounds):
        n = q.shape[-2]
        out = v.new_empty(*v.shape[:2], n, v.shape[-1], dtype=q.dtype)
        starts = []
        for s, e in bounds:
            starts.append(state)
            inputs = sliced((q, k, v, beta, log_decay), s, e)
            out[:, :, s:e], state = _segment(*inputs, state, *setup)
        ctx.save_for_backward(q, k, v, beta, log_decay, *starts)
        ctx.bounds, ctx.setup = bounds, setup
        return out, state

    @staticmethod
    def backward(ctx, grad_o, grad_state):
        q, k, v, beta, log_decay, *starts = ctx.saved_tensors
        inputs = (q, k, v, beta, log_decay)
        grads = [None if t is None else torch.empty_like(t) for t in inputs]
        for (s, e), start in zip(reversed(ctx.bounds), reversed(starts)):
            with torch.enable_grad():
                leaves = [
                    None if t is None else t.detach().requires_grad_()
                    for t in (*sliced(inputs, s, e), start)
                ]
                o, state = _segment(*leaves, *ctx.setup)
                found = torch.autograd.grad(
                    (o, state),
                    [t for t in leaves if t is not None],
                    (grad_o[:, :, s:e], grad_state),
                )
            found = iter(found)
            for g, t in zip(grads, leaves):
                if t is not None:
                    g[:, :, s:e] = next(found)
            grad_state = next(found)
        return (*grads, grad_state, None, None)


def _segment(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    log_decay: Tensor | None,
    state: Tensor,
    scale: float,
    chunk_length: int,
    normalise_qk: bool = False,
) -> tuple[Tensor, Tensor]:
    """chunk_delta with plain autograd, from an incoming state (b, h, dk, dv)."""
    b, h, n, _ = k.shape
    dtype, wide = q.dtype, compute_dtype(q.dtype)
    if normalise_qk:
        q, k = l2_normalised(q.to(wide)), l2_normalised(k.to(wide))
    c = min(chunk_length, n)  # a short call (a decode step) is one chunk of its own length
    # (b h nc) c d: the chunks of every head as one batch of small matrices; padding keys and
    # beta with zeros writes nothing, log_decay = 0 keeps the state as it is
    q, k, v, beta = (_chunks(t.to(wide), c) for t in (q, k, v, beta[..., None]))
    decay = None if log_decay is None else _chunks(log_decay[..., None].to(wide), c)[..., 0]

    p = _within_chunks(q, k, v, beta, decay, scale)
    state = state.to(wide).flatten(0, 1)
    if q.shape[0] == b * h:  # one chunk: no (dk x dk) map, S' = a S + K^T u
        starts = state
        u = torch.baddbmm(p.values, p.minus_writes, starts)
        final = state if p.decay is None else state * p.decay
        final = torch.baddbmm(final, p.keys.mT, u)
    else:
        starts, final = _chunk_starts(p, state)
        u = torch.baddbmm(p.values, p.minus_writes, starts)  # what each chunk writes
    o = torch.baddbmm(p.queries @ starts, p.scores, u)  # (b h nc) c dv
    o = o.unflatten(0, (b, h, -1)).flatten(2, 3)[:, :, :n]
    return o.to(dtype), final.unflatten(0, (b, h))


def _chunks(x: Tensor, c: int) -> Tensor:
    """(b, h, n, d) -> ((b h nc), c, d), zero-padded to whole chunks."""
    pad = padded_length(x.shape[-2], c) - x.shape[-2]
    if pad:
        x = F.pad(x, (0, 0, 0, pad))
    return x.unflatten(-2, (-1, c)).flatten(0, 2)


class _Chunks(NamedTuple):
    """Each chunk's part of the recurrence that does not depend on its incoming state S, as
    ((b h nc), *, *) tensors: the chunk writes u = values + minus_writes S, outputs queries S +
    scores u, and leaves decay S + keys^T u = (decay I + keys^T minus_writes) S + keys^T values."""

    queries: Tensor  # scale * q, decayed from the chunk's start
    scores: Tensor  # (B, c, c): causal, decayed query-key products
    values: Tensor  # (B, c, dv): the values written from a zero state (U)
    minus_writes: Tensor  # (B, c, dk): how they depend on the state (-W), decayed from the start
    keys: Tensor  # decayed to the chunk's end
    decay: Tensor | None  # (B, 1, 1): the chunk's whole decay


def _within_chunks(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, decay: Tensor | None, scale: float
) -> _Chunks:
    """The UT transform of every chunk at once, from (B, c, *) inputs: with A = strictly-lower(
    diag(beta) K K^T * decays), (I + A) U = diag(beta) V; W solves the same system without decays,
    which then scale its rows (so no product of decays, which could be subnormal, is formed)."""
    c = k.shape[-2]
    causal = torch.ones(c, c, dtype=torch.bool, device=k.device).tril()
    k_beta = k * beta
    lower = k_beta @ k.mT  # only the strictly lower part is read
    v_beta = v * beta
    q = q * scale
    scores = q @ k.mT
    if decay is None:
        rhs = torch.cat([v_beta, k * -beta], dim=-1)
        values, minus_writes = _solve_unit_lower(lower, rhs).split([v.shape[-1], k.shape[-1]], -1)
        return _Chunks(q, scores.masked_fill_(~causal, 0), values, minus_writes, k, None)
    cum = decay.cumsum(-1)  # (B, c): log of the decay from the chunk's start
    # exp(c_i - c_j) only where i >= j (<= 0 there): never the exponential of a positive sum
    gaps = _exp_decay((cum[:, :, None] - cum[:, None, :]).masked_fill_(~causal, -torch.inf))
    last = cum[:, -1:]  # (B, 1)
    from_start = _exp_decay(cum)[..., None]
    return _Chunks(
        queries=q * from_start,
        scores=scores * gaps,
        values=_solve_unit_lower(lower * gaps, v_beta),
        minus_writes=_solve_unit_lower(lower, k_beta) * -from_start,
        keys=k * _exp_decay(last - cum)[..., None],
        decay=_exp_decay(last)[..., None],
    )


def _solve_unit_lower(lower: Tensor, rhs: Tensor) -> Tensor:
    """X with (I + strictly_lower(lower)) X = rhs, (B, c, c) and (B, c, r), solved as X^T L^T =
    rhs^T: the transposed views are the column-major batches LAPACK takes, so nothing is copied."""
    return torch.linalg.solve_triangular(
        lower.mT, rhs.mT, upper=True, left=False, unitriangular=True
    ).mT


def _exp_decay(log_decay: Tensor) -> Tensor:
    """exp of log decays (<= 0), zero below the square root of the smallest normal number: their
    products with O(1) numbers would be subnormal, where CPU arithmetic is many times slower."""
    floor = math.log(torch.finfo(log_decay.dtype).tiny) / 2
    return exp_(log_decay.masked_fill(log_decay < floor, -torch.inf))


def _chunk_starts(p: _Chunks, state: Tensor) -> tuple[Tensor, Tensor]:
    """The state entering each chunk, ((b h nc), dk, dv), and the final state ((b h), dk, dv):
    across a chunk the state maps affinely, S' = maps S + shifts, one matmul per chunk."""
    bh, dk = state.shape[:2]
    if p.decay is None:
        diagonal = torch.eye(dk, dtype=state.dtype, device=state.device)
    else:
        diagonal = torch.diag_embed(p.decay[:, 0].expand(-1, dk))
    maps = torch.baddbmm(diagonal, p.keys.mT, p.minus_writes)  # a I - K^T W
    shifts = p.keys.mT @ p.values
    # unbind, not indexing: indexing in the loop makes the backward zero-fill a full-size
    # gradient per chunk
    states = [state]
    for m, s in zip(maps.unflatten(0, (bh, -1)).unbind(1), shifts.unflatten(0, (bh, -1)).unbind(1)):
        states.append(torch.baddbmm(s, m, states[-1]))
    return torch.stack(states[:-1], dim=1).flatten(0, 1), states[-1]
