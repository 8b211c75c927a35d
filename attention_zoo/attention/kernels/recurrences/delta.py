"""The delta rule (DeltaNet) and its gated form (Gated DeltaNet) in chunks: the WY/UT form.

S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T, o_t = scale S_t^T q_t (Yang et al. 2024,
"Parallelizing Linear Transformers with the Delta Rule over Sequence Length"; Yang et al. 2025,
"Gated Delta Networks"). Within a chunk the written values come from the inverse of a
unit lower-triangular matrix; only the state (b, h, dk, dv) crosses chunks, one matmul per chunk.
The backward is written out (`_segment_grads`), a segment at a time.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor, linalg
from torch.nn import functional as F

from ..autocast import backward_without_autocast
from ..chunked import padded_length
from ..exp import exp_
from ..segments import backward_segments, forward_segments, needs_grad, segments
from ..sums.plain import compute_dtype
from .decay import exclusive_suffix, segment_sums
from .reference import NORM_EPS, l2_normalised

# Tokens per segment: a call runs segment by segment, and its backward recomputes one segment's
# chunks at a time, so what they hold (a dozen tensors the size of q) exists for one segment
# only, and stays in cache.
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
    inputs = (q, k, v, beta, log_decay, state)
    if n == 1:
        return _step(inputs, scale, normalise_qk)
    setup = (scale, chunk_length, normalise_qk)
    bounds = segments(n, chunk_length, SEGMENT_LENGTH)
    if needs_grad(*inputs):
        return _Segments.apply(*inputs, setup, bounds)
    out, _, state = _forward(inputs, setup, bounds)
    return out, state


def _step(
    inputs: tuple[Tensor | None, ...], scale: float, normalise_qk: bool
) -> tuple[Tensor, Tensor]:
    """One token (a decode step): (q, k (b, h, 1, dk), v (b, h, 1, dv), beta, log_decay (b, h, 1),
    state (b, h, dk, dv)) -> o (b, h, 1, dv), the new state; chunk_delta's result, in fewer ops."""
    q, k, v, beta, log_decay, state = inputs
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


def _forward(
    inputs: tuple[Tensor, ...], setup: tuple[float, int, bool], bounds: list[tuple[int, int]]
) -> tuple[Tensor, list[Tensor], Tensor]:
    """The segments of (q, k, v, beta, log_decay, state) in order: o in q's dtype, the state
    entering each segment, the final state."""
    *streams, state = inputs
    q, v = streams[0], streams[2]
    out = v.new_empty(*v.shape[:2], q.shape[2], v.shape[-1], dtype=q.dtype)
    entering, state = forward_segments(lambda *x: _segment(*x, *setup), streams, state, bounds, out)
    return out, entering, state


class _Segments(torch.autograd.Function):
    """chunk_delta a segment at a time, keeping only the state entering each; the backward
    recomputes one segment's chunks at a time, last first, and differentiates them by hand
    (`_segment_grads`): no graph is built, nothing chunk-sized outlives its segment."""

    @staticmethod
    def forward(ctx, q, k, v, beta, log_decay, state, setup, bounds):
        out, entering, state = _forward((q, k, v, beta, log_decay, state), setup, bounds)
        ctx.save_for_backward(q, k, v, beta, log_decay, *entering)
        ctx.bounds, ctx.setup = bounds, setup
        return out, state

    @staticmethod
    @backward_without_autocast
    def backward(ctx, grad_o, grad_state):
        q, k, v, beta, log_decay, *entering = ctx.saved_tensors
        inputs = (q, k, v, beta, log_decay)
        if len(ctx.bounds) == 1:  # the segment's gradients are the whole ones
            *grads, grad_state = _segment_grads(
                *inputs, grad_o, entering[0], grad_state, *ctx.setup
            )
            return (*grads, grad_state.to(entering[0].dtype), None, None)
        grads = [None if t is None else torch.empty_like(t) for t in inputs]
        grad_state = backward_segments(
            lambda *x: _segment_grads(*x, *ctx.setup),
            inputs, grad_o, entering, grad_state, ctx.bounds, grads,
        )  # fmt: skip
        return (*grads, grad_state.to(entering[0].dtype), None, None)


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
    c = max(1, min(chunk_length, n))  # a short call (a decode step): one chunk of its length
    x = _prepared(q, k, v, beta, log_decay, c, normalise_qk)
    p = _within_chunks(*x, scale)[0]  # what only the backward reads goes at once
    starts, u, final = _carry(p, state.to(x[0].dtype).flatten(0, 1))
    o = torch.baddbmm(p.queries @ starts, p.scores, u)  # (b h nc) c dv
    return _unchunked(o, b, h, n).to(q.dtype), final.unflatten(0, (b, h))


def _segment_grads(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    log_decay: Tensor | None,
    grad_o: Tensor,
    state: Tensor,
    grad_state: Tensor,
    scale: float,
    chunk_length: int,
    normalise_qk: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None, Tensor]:
    """The vector-Jacobian product of `_segment`: dq, dk, dv, dbeta, d log_decay (None without
    one) and the gradient of the state entering, from grad_o and that of the state leaving."""
    b, h, n, _ = k.shape
    c = max(1, min(chunk_length, n))
    qc, kc, vc, bc, gc = _prepared(q, k, v, beta, log_decay, c, normalise_qk)
    wide = qc.dtype
    p, solved = _within_chunks(qc, kc, vc, bc, gc, scale)
    starts, written, _ = _carry(p, state.to(wide).flatten(0, 1))
    d_o = _chunks(grad_o.to(wide), c)
    d_written, d_exits, d_entering = _carry_back(p, d_o, grad_state.to(wide).flatten(0, 1))
    d_scores = (d_o @ written.mT).tril_()
    d_keys = written @ d_exits.mT
    del written
    d_queries = d_o @ starts.mT
    del d_o
    # the UT transform: X = [values, minus_writes] solves (I + A) X = R, R = [v beta, -writes]:
    # dR = (I + A)^-T dX, dA = -dR X^T (strictly lower)
    d_rhs = solved.inverse.mT @ torch.cat([d_written, d_written @ starts.mT], dim=-1)
    del d_written
    d_system = (d_rhs @ torch.cat([p.values, p.minus_writes], dim=-1).mT).tril_(-1).neg_()
    d_vbeta, d_writes = d_rhs.split([vc.shape[-1], kc.shape[-1]], dim=-1)
    d_writes = d_writes.neg_()  # a view of d_rhs, which nothing else reads
    k_beta, qs = kc * bc, qc * scale
    dg = None
    if solved.gaps is None:
        d_kbeta, dqs, dk = d_writes, d_queries, d_keys
    else:
        # every decay is exp of a difference of cum, the log decay summed from the chunk's start
        spans = (d_system * solved.system).add_(d_scores * p.scores)
        d_cum = spans.sum(-1) - spans.sum(-2)
        del spans
        to_end = linalg.vecdot(d_keys, kc) * solved.to_end[..., 0]
        from_start = linalg.vecdot(d_queries, qs) + linalg.vecdot(d_writes, k_beta)
        d_cum += from_start * solved.from_start[..., 0] - to_end
        whole = linalg.vecdot(starts.flatten(1), d_exits.flatten(1)) * p.decay[:, 0, 0]
        d_cum[:, -1] += to_end.sum(-1) + whole
        dg = _unchunked(d_cum.flip(-1).cumsum(-1).flip(-1)[..., None], b, h, n)[..., 0]
        d_system.mul_(solved.gaps), d_scores.mul_(solved.gaps)  # the undecayed products'
        d_kbeta = d_writes.mul_(solved.from_start)
        dqs, dk = d_queries.mul_(solved.from_start), d_keys.mul_(solved.to_end)
    del p, solved, starts, d_exits
    dqs = dqs.baddbmm_(d_scores, kc)
    dk = dk.baddbmm_(d_scores.mT, qs).baddbmm_(d_system.mT, k_beta)
    d_kbeta = d_kbeta.baddbmm_(d_system, kc)
    del d_scores, d_system
    dk = dk.addcmul_(d_kbeta, bc)
    dv = d_vbeta * bc
    dbeta = linalg.vecdot(d_vbeta, vc) + linalg.vecdot(d_kbeta, kc)
    dq, dk, dv, dbeta = (_unchunked(t, b, h, n) for t in (dqs * scale, dk, dv, dbeta[..., None]))
    if normalise_qk:
        dq, dk = _through_normalisation(q.to(wide), dq), _through_normalisation(k.to(wide), dk)
    grads = (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dbeta[..., 0].to(beta.dtype))
    dg = None if dg is None else dg.to(log_decay.dtype)
    return (*grads, dg, d_entering.unflatten(0, (b, h)))


def _prepared(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    log_decay: Tensor | None,
    c: int,
    normalise_qk: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """q, k (normalised when asked), v, beta[..., None] as ((b h nc), c, *) chunks in the compute
    dtype, log_decay as ((b h nc), c): the chunks of every head as one batch of small matrices;
    padding keys and beta with zeros writes nothing, log_decay = 0 keeps the state as it is."""
    wide = compute_dtype(q.dtype)
    q, k = q.to(wide), k.to(wide)
    if normalise_qk:
        q, k = l2_normalised(q), l2_normalised(k)
    q, k, v, beta = (_chunks(t.to(wide), c) for t in (q, k, v, beta[..., None]))
    decay = None if log_decay is None else _chunks(log_decay[..., None].to(wide), c)[..., 0]
    return q, k, v, beta, decay


def _chunks(x: Tensor, c: int) -> Tensor:
    """(b, h, n, d) -> ((b h nc), c, d), zero-padded to whole chunks."""
    pad = padded_length(x.shape[-2], c) - x.shape[-2]
    if pad:
        x = F.pad(x, (0, 0, 0, pad))
    return x.unflatten(-2, (-1, c)).flatten(0, 2)


def _unchunked(x: Tensor, b: int, h: int, n: int) -> Tensor:
    """((b h nc), c, d) -> (b, h, n, d): `_chunks` undone, the padding dropped."""
    return x.unflatten(0, (b, h, -1)).flatten(2, 3)[:, :, :n]


def _through_normalisation(x: Tensor, grad: Tensor) -> Tensor:
    """The gradient of x from that of l2_normalised(x) = x / max(||x||, eps)."""
    norm = linalg.vector_norm(x, dim=-1, keepdim=True)
    bounded = norm.clamp(min=NORM_EPS)
    unit = x / bounded
    along = linalg.vecdot(unit, grad)[..., None].masked_fill_(norm < NORM_EPS, 0)
    return grad.sub_(unit.mul_(along)).div_(bounded)


class _Chunks(NamedTuple):
    """Each chunk's part of the recurrence that does not depend on its incoming state S, as
    ((b h nc), *, *) tensors: the chunk writes u = values + minus_writes S, outputs queries S +
    scores u, and leaves decay S + keys^T u = (decay I + keys^T minus_writes) S + keys^T values."""

    queries: Tensor  # scale * q, decayed from the chunk's start
    scores: Tensor  # (B, c, c): causal, decayed query-key products
    values: Tensor  # (B, c, dv): the values written from a zero state (U)
    minus_writes: Tensor  # (B, c, dk): how they depend on the state (-W)
    keys: Tensor  # decayed to the chunk's end
    decay: Tensor | None  # (B, 1, 1): the chunk's whole decay


class _Solved(NamedTuple):
    """What the backward reads besides, ((b h nc), *, *) tensors."""

    system: Tensor  # (B, c, c): beta_i k_i . k_j, decayed from j to i; its strictly lower part A
    inverse: Tensor  # (I + A)^-1
    gaps: Tensor | None  # (B, c, c): the decay from j to i, i >= j, else 0
    from_start: Tensor | None  # (B, c, 1): the decay from the chunk's start into each token
    to_end: Tensor | None  # (B, c, 1): the decay from each token to the chunk's end


def _within_chunks(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, decay: Tensor | None, scale: float
) -> tuple[_Chunks, _Solved]:
    """The UT transform of every chunk at once, from (B, c, *) inputs: with A = strictly-lower(
    diag(beta) K K^T * decays), (I + A) [U, W] = [diag(beta) V, diag(beta decay from start) K]:
    one triangular solve. Every decay is exp of a sum <= 0: it underflows, never overflows."""
    c = k.shape[-2]
    causal = torch.ones(c, c, dtype=torch.bool, device=k.device).tril()
    k_beta = k * beta
    lower = k_beta @ k.mT  # only the strictly lower part is read
    q = q * scale
    scores = q @ k.mT
    if decay is None:
        gaps = from_start = to_end = whole = None
        system, writes, keys = lower, k_beta, k
        scores.masked_fill_(~causal, 0)
    else:
        cum = decay.cumsum(-1)  # (B, c): log of the decay from the chunk's start
        # each span summed on its own (never c_i - c_j: it cancels, and is NaN at a decay of 0)
        gaps = _exp_decay(segment_sums(decay[..., None]))
        last = cum[:, -1:]  # (B, 1)
        from_start = _exp_decay(cum)[..., None]
        to_end = _exp_decay(exclusive_suffix(decay, -1))[..., None]
        whole = _exp_decay(last)[..., None]
        system, writes, keys = lower * gaps, k_beta * from_start, k * to_end
        q, scores = q * from_start, scores * gaps
    del lower  # the system holds it, decayed
    inverse = _inverse_unit_lower(system)
    rhs = torch.cat([v * beta, writes.neg()], dim=-1)
    values, minus_writes = (inverse @ rhs).split([v.shape[-1], k.shape[-1]], -1)
    return (
        _Chunks(q, scores, values, minus_writes, keys, whole),
        _Solved(system, inverse, gaps, from_start, to_end),
    )


def _inverse_unit_lower(lower: Tensor) -> Tensor:
    """(I + strictly_lower(lower))^-1 of (B, c, c), solved as X^T L^T = I: lower's transposed
    view is the column-major batch LAPACK takes. Products with it are then matmuls, the
    backward's transposed system included, faster than a triangular solve per right side; less
    accurate than one where a chunk's system is ill-conditioned (nearly parallel keys with beta
    near 2), and bounded there: unit keys and beta <= 2 keep the inverse's entries small."""
    eye = torch.eye(lower.shape[-1], dtype=lower.dtype, device=lower.device)
    return torch.linalg.solve_triangular(
        lower.mT, eye.expand_as(lower), upper=True, left=False, unitriangular=True
    ).mT


def _exp_decay(log_decay: Tensor) -> Tensor:
    """exp of log decays (<= 0), zero below the square root of the smallest normal number: their
    products with O(1) numbers would be subnormal, where CPU arithmetic is many times slower."""
    floor = math.log(torch.finfo(log_decay.dtype).tiny) / 2
    return exp_(log_decay.masked_fill(log_decay < floor, -torch.inf))


def _carry(p: _Chunks, state: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The state entering each chunk ((b h nc), dk, dv), what each chunk writes, u = values +
    minus_writes S ((b h nc), c, dv), and the final state ((b h), dk, dv): S' = a S + keys^T u,
    two products per chunk, the chunks walked with unbind (a loop over chunks only)."""
    entering, written = [], []
    for values, minus_writes, keys, decay in _per_chunk(p, state.shape[0]):
        entering.append(state)
        written.append(torch.baddbmm(values, minus_writes, state))
        state = torch.baddbmm(state if decay is None else state * decay, keys.mT, written[-1])
    return _stacked(entering), _stacked(written), state


def _carry_back(p: _Chunks, d_o: Tensor, d: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The gradients of what each chunk writes ((b h nc), c, dv), of the state leaving each
    ((b h nc), dk, dv) and of the state entering the first ((b h), dk, dv), from those of the
    outputs and of the state leaving the last (d), the chunks walked last first:
    du = scores^T do + keys dS', dS = a dS' + queries^T do + minus_writes^T du."""
    bh = d.shape[0]
    per_head = [t.unflatten(0, (bh, -1)).unbind(1) for t in (p.scores.mT @ d_o, p.queries.mT @ d_o)]
    d_written, leaving = [], []
    for (_, minus_writes, keys, decay), scores_do, queries_do in reversed(
        list(zip(_per_chunk(p, bh), *per_head))
    ):
        leaving.append(d)
        d_written.append(torch.baddbmm(scores_do, keys, d))
        pushed = queries_do + d if decay is None else torch.addcmul(queries_do, d, decay)
        d = torch.baddbmm(pushed, minus_writes.mT, d_written[-1])
    return _stacked(d_written[::-1]), _stacked(leaving[::-1]), d


def _per_chunk(p: _Chunks, bh: int) -> list[tuple[Tensor, Tensor, Tensor, Tensor | None]]:
    """Each chunk's values, minus_writes, keys and decay, every head at once ((b h), ...)."""
    split = [t.unflatten(0, (bh, -1)).unbind(1) for t in (p.values, p.minus_writes, p.keys)]
    decays = [None] * len(split[0]) if p.decay is None else p.decay.unflatten(0, (bh, -1)).unbind(1)
    return list(zip(*split, decays))


def _stacked(per_chunk: list[Tensor]) -> Tensor:
    """Per-chunk ((b h), ...) tensors, in order -> ((b h nc), ...)."""
    return torch.stack(per_chunk, dim=1).flatten(0, 1)
