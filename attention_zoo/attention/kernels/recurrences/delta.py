"""The delta rule (DeltaNet) and its gated form (Gated DeltaNet) in chunks: the WY/UT form.

S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T, o_t = scale S_t^T q_t (Yang et al. 2024,
"Parallelizing Linear Transformers with the Delta Rule over Sequence Length"; Yang et al. 2025,
"Gated Delta Networks"). Within a chunk the written values come from the inverse of a
unit lower-triangular matrix; only the state (b, h, dk, dv) crosses chunks, two matmuls per chunk.
The backward is written out (`_segment_grads`), a segment at a time, from the states the forward
kept at every other chunk.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, linalg
from torch.nn import functional as F

from ..backward import hand_written_backward
from ..chunked import padded_length
from ..exp import exp_
from ..segments import (
    SEGMENT_LENGTH,
    backward_segments,
    forward_segments,
    joined,
    needs_grad,
    segments,
)
from ..sums.plain import compute_dtype
from .decay import decay_weights, exclusive_suffix, log_floor
from .reference import NORM_EPS, l2_normalised


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
    bounds = segments(n, chunk_length, _segment_length(n))
    if needs_grad(*inputs):
        return _Segments.apply(*inputs, setup, bounds)
    out, _, state = _forward(inputs, setup, bounds, keep_starts=False)
    return out, state


def _segment_length(n: int) -> int:
    """SEGMENT_LENGTH, doubled where that is at most a sixteenth of the call's n tokens: a segment
    still holds a small share of what the call holds anyway (its inputs and their gradients), and
    a long call pays its ops' fixed costs on half as many segments."""
    return 2 * SEGMENT_LENGTH if n >= 32 * SEGMENT_LENGTH else SEGMENT_LENGTH


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
    inputs: tuple[Tensor, ...],
    setup: tuple[float, int, bool],
    bounds: list[tuple[int, int]],
    keep_starts: bool = True,
) -> tuple[Tensor, list[Tensor | None], Tensor]:
    """The segments of (q, k, v, beta, log_decay, state) in order: o in q's dtype, the states
    entering each segment's even chunks (`_even`; None where not kept), the final state."""
    *streams, state = inputs
    q, v = streams[0], streams[2]
    out = v.new_empty(*v.shape[:2], q.shape[2], v.shape[-1], dtype=q.dtype)

    def segment(*x: Tensor | None) -> tuple[Tensor, Tensor, Tensor | None]:
        o, after, starts = _segment(*x, *setup)
        return o, after, _even(starts, after.shape[0] * after.shape[1]) if keep_starts else None

    starts, state = forward_segments(segment, streams, state, bounds, out)
    return out, starts, state


class _Segments(torch.autograd.Function):
    """chunk_delta a segment at a time, keeping the state entering every other chunk (n / 2c
    states: the others follow from them all at once, where walking the chunks again would be a
    sequential loop); the backward recomputes the rest one segment at a time, last first, and
    differentiates it by hand (`_segment_grads`): no graph is built, nothing else chunk-sized
    outlives its segment."""

    @staticmethod
    def forward(ctx, q, k, v, beta, log_decay, state, setup, bounds):
        out, starts, final = _forward((q, k, v, beta, log_decay, state), setup, bounds)
        ctx.save_for_backward(q, k, v, beta, log_decay, *starts)
        ctx.bounds, ctx.setup, ctx.state_dtype = bounds, setup, state.dtype
        return out, final

    @staticmethod
    @hand_written_backward
    def backward(ctx, grad_o, grad_state):
        q, k, v, beta, log_decay, *starts = ctx.saved_tensors
        inputs = (q, k, v, beta, log_decay)
        if len(ctx.bounds) == 1:  # the segment's gradients are the whole ones
            *grads, grad_state = _segment_grads(*inputs, grad_o, starts[0], grad_state, *ctx.setup)
            grads = [None if g is None else joined(g, q.shape[2]) for g in grads]
            return (*grads, grad_state.to(ctx.state_dtype), None, None)
        grads = [None if t is None else torch.empty_like(t) for t in inputs]
        grad_state = backward_segments(
            lambda *x: _segment_grads(*x, *ctx.setup),
            inputs, grad_o, starts, grad_state, ctx.bounds, grads,
        )  # fmt: skip
        return (*grads, grad_state.to(ctx.state_dtype), None, None)


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
) -> tuple[Tensor, Tensor, Tensor]:
    """chunk_delta's forward, from an incoming state (b, h, dk, dv) (no autograd: `_Segments`
    differentiates it): o in whole chunks (b, h, nc, c, dv) (`put` writes it), the state after,
    and the state entering each chunk ((nc b h), dk, dv)."""
    b, h, n, _ = k.shape
    c = max(1, min(chunk_length, n))  # a short call (a decode step): one chunk of its length
    x, _ = _prepared(q, k, v, beta, log_decay, c, normalise_qk, scale)
    wide = x[0].dtype
    p = _within_chunks(*x)[0]  # what only the backward reads goes at once, and the inputs
    del x
    starts, u, final = _carry(p, state.to(wide).flatten(0, 1))
    o = torch.baddbmm(p.queries @ starts, p.scores, u)  # (nc b h) c dv
    return _unchunked(o, b, h).to(q.dtype), final.unflatten(0, (b, h)), starts


def _segment_grads(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    log_decay: Tensor | None,
    grad_o: Tensor,
    even_starts: Tensor,
    grad_state: Tensor,
    scale: float,
    chunk_length: int,
    normalise_qk: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None, Tensor]:
    """The vector-Jacobian product of `_segment`: dq, dk, dv, dbeta, d log_decay (None without
    one) in whole chunks (b, h, nc, c, *) (`put` writes them) and the gradient of the state
    entering, from grad_o, the state entering each even chunk (`_even`) and the gradient of the
    state leaving."""
    b, h, n, _ = k.shape
    c = max(1, min(chunk_length, n))
    (qs, kc, vc, bc, gc), norms = _prepared(q, k, v, beta, log_decay, c, normalise_qk, scale)
    wide = qs.dtype
    # each tensor is let go once read for the last time: they bound the segment's memory
    p, solved = _within_chunks(qs, kc, vc, bc, gc)
    queries, scores, values, minus_writes, keys, decay = p
    system, inverse, k_beta, gaps, from_start, to_end = solved
    del p, solved
    starts = _every_start(even_starts, values, minus_writes, keys, decay)
    written = torch.baddbmm(values, minus_writes, starts)  # u, every chunk at once
    d_o = _chunks(grad_o.to(wide), c)
    d_written, d_exits, d_entering = _carry_back(
        (scores, queries, minus_writes, keys, decay), d_o, grad_state.to(wide).flatten(0, 1)
    )
    del queries, keys
    d_scores = d_o @ written.mT  # causal once multiplied by the mask or the decays
    spans = None if gaps is None else d_scores * scores
    del scores
    d_keys = written @ d_exits.mT
    # the gradient of the chunk's whole decay (only with decays)
    d_whole = None if decay is None else linalg.vecdot(starts.flatten(1), d_exits.flatten(1))
    del written, d_exits
    d_queries = d_o @ starts.mT
    del d_o
    # the UT transform: X = [values, minus_writes] solves (I + A) X = R, R = [v beta, -writes]:
    # dR = (I + A)^-T dX with dX = [du, du S^T], dA = -dR X^T (strictly lower)
    d_vbeta = inverse.mT @ d_written
    del d_written, inverse
    dv, dbeta = d_vbeta * bc, linalg.vecdot(d_vbeta, vc)
    del vc
    d_minus_writes = d_vbeta @ starts.mT
    d_system = d_vbeta @ values.mT
    del d_vbeta, values
    causal, minus_strictly_lower = _masks(c, wide, kc.device)
    d_system.baddbmm_(d_minus_writes, minus_writes.mT).mul_(minus_strictly_lower)
    del minus_writes
    d_writes = d_minus_writes.neg_()
    dg = None
    if gaps is None:
        d_scores.mul_(causal)
        d_kbeta, dqs, dk = d_writes, d_queries, d_keys
    else:
        # every decay is exp of a difference of cum, the log decay summed from the chunk's start
        spans = spans.addcmul_(d_system, system)
        del system
        d_cum = spans.sum(-1) - spans.sum(-2)
        del spans
        to_end_sums = linalg.vecdot(d_keys, kc) * to_end[..., 0]
        from_start_sums = torch.addcmul(d_queries * qs, d_writes, k_beta).sum(-1)
        d_cum += from_start_sums * from_start[..., 0] - to_end_sums
        d_cum[:, -1] += to_end_sums.sum(-1) + d_whole * decay[:, 0, 0]
        dg = _unchunked(d_cum.flip(-1).cumsum(-1).flip(-1)[..., None], b, h)[..., 0]
        d_system.mul_(gaps), d_scores.mul_(gaps)  # the undecayed products'
        del gaps
        d_kbeta = d_writes.mul_(from_start)
        dqs, dk = d_queries.mul_(from_start), d_keys.mul_(to_end)
    del starts
    dqs = dqs.baddbmm_(d_scores, kc)
    dk = dk.baddbmm_(d_scores.mT, qs).baddbmm_(d_system.mT, k_beta)
    d_kbeta = d_kbeta.baddbmm_(d_system, kc)
    del d_scores, d_system
    dk = dk.addcmul_(d_kbeta, bc)
    dbeta = dbeta.add_(linalg.vecdot(d_kbeta, kc))[..., None]
    if norms is None:
        dq = dqs.mul_(scale)
    else:
        dq = _through_normalisation(qs, norms[0], dqs, scale)
        dk = _through_normalisation(kc, norms[1], dk, 1.0)
    dq, dk, dv, dbeta = (_unchunked(t, b, h) for t in (dq, dk, dv, dbeta))
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
    scale: float,
) -> tuple[tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None], tuple[Tensor, Tensor] | None]:
    """scale q, k (both normalised when asked), v, beta[..., None] as ((nc b h), c, *) chunks in
    the compute dtype, log_decay as ((nc b h), c): the chunks of every head as one batch of small
    matrices; padding keys and beta with zeros writes nothing, log_decay = 0 keeps the state as it
    is. Then the norms of q and k ((nc b h), c, 1) when normalised (their backward reads them)."""
    wide = compute_dtype(q.dtype)
    q, k = q.to(wide), k.to(wide)
    norms = None
    if normalise_qk:  # l2_normalised's arithmetic, the scale in q's divisor, the norms kept
        norms = [linalg.vector_norm(t, dim=-1, keepdim=True) for t in (q, k)]
        bounded = [norm.clamp(min=NORM_EPS) for norm in norms]
        q, k = _chunks(q, c, bounded[0].div_(scale)), _chunks(k, c, bounded[1])
        norms = tuple(_chunks(norm, c) for norm in norms)
    else:
        q, k = _chunks(q, c, 1 / scale), _chunks(k, c)
    v, beta = _chunks(v.to(wide), c), _chunks(beta[..., None].to(wide), c)
    decay = None if log_decay is None else _chunks(log_decay[..., None].to(wide), c)[..., 0]
    return (q, k, v, beta, decay), norms


def _chunks(x: Tensor, c: int, divisor: Tensor | float | None = None) -> Tensor:
    """(b, h, n, d) -> ((nc b h), c, d), zero-padded to whole chunks, contiguous: each chunk's
    heads are one contiguous batch, which the carry walks, and products take it without a copy.
    With a divisor (a number or (b, h, n, 1)), x / divisor, in a new tensor."""
    pad = padded_length(x.shape[-2], c) - x.shape[-2]
    if pad:
        x = F.pad(x, (0, 0, 0, pad))
        if isinstance(divisor, Tensor):
            divisor = F.pad(divisor, (0, 0, 0, pad), value=1.0)

    def chunked(t: Tensor) -> Tensor:
        return t.unflatten(-2, (-1, c)).permute(2, 0, 1, 3, 4)

    if divisor is None:
        return chunked(x).reshape(-1, c, x.shape[-1]).contiguous()
    if isinstance(divisor, Tensor):
        divisor = chunked(divisor)
    return torch.div(chunked(x), divisor).reshape(-1, c, x.shape[-1])


def _unchunked(x: Tensor, b: int, h: int) -> Tensor:
    """((nc b h), c, d) -> (b, h, nc, c, d), a view: `_chunks` undone as `put` takes it, or
    `joined`, the padding dropped."""
    return x.unflatten(0, (-1, b, h)).permute(1, 2, 0, 3, 4)


def _masks(c: int, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
    """The causal (c, c) mask and minus the strictly lower one, as numbers: a product with
    them is faster than tril or masked_fill."""
    ones = torch.ones(c, c, dtype=dtype, device=device)
    return ones.tril(), ones.tril_(-1).neg_()


def _through_normalisation(y: Tensor, norm: Tensor, grad: Tensor, scale: float) -> Tensor:
    """The gradient of x (consuming grad) from that of y = scale x / max(norm, eps), norm = ||x||:
    (grad - y (y . grad) / scale^2) scale / norm; where norm < eps, y is linear in x: grad scale /
    eps."""
    along = linalg.vecdot(y, grad)[..., None].masked_fill_(norm < NORM_EPS, 0).div_(scale * scale)
    return grad.addcmul_(y, along, value=-1).mul_(scale / norm.clamp(min=NORM_EPS))


class _Chunks(NamedTuple):
    """Each chunk's part of the recurrence that does not depend on its incoming state S, as
    ((nc b h), *, *) tensors: the chunk writes u = values + minus_writes S, outputs queries S +
    scores u, and leaves decay S + keys^T u = (decay I + keys^T minus_writes) S + keys^T values."""

    queries: Tensor  # scale q, decayed from the chunk's start
    scores: Tensor  # (B, c, c): causal, decayed query-key products
    values: Tensor  # (B, c, dv): the values written from a zero state (U)
    minus_writes: Tensor  # (B, c, dk): how they depend on the state (-W)
    keys: Tensor  # decayed to the chunk's end
    decay: Tensor | None  # (B, 1, 1): the chunk's whole decay


class _Solved(NamedTuple):
    """What the backward reads besides, ((nc b h), *, *) tensors; decays None without them."""

    system: Tensor | None  # (B, c, c): beta_i k_i . k_j, decayed from j to i (decays only)
    inverse: Tensor  # (I + A)^-1, A the system's strictly lower part
    k_beta: Tensor  # (B, c, dk): beta k
    gaps: Tensor | None  # (B, c, c): the decay from j to i, i >= j, else 0
    from_start: Tensor | None  # (B, c, 1): the decay from the chunk's start into each token
    to_end: Tensor | None  # (B, c, 1): the decay from each token to the chunk's end


def _within_chunks(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, decay: Tensor | None
) -> tuple[_Chunks, _Solved]:
    """The UT transform of every chunk at once, from (B, c, *) inputs, q scaled: with A =
    strictly-lower(diag(beta) K K^T * decays), (I + A) [U, W] = [diag(beta) V, diag(beta decay
    from start) K]: one triangular solve. Every decay is exp of a sum <= 0: it underflows, never
    overflows."""
    c = k.shape[-2]
    k_beta = k * beta
    system = k_beta @ k.mT  # only the strictly lower part is read
    scores = q @ k.mT
    if decay is None:
        gaps = from_start = to_end = whole = None
        keys, minus_writes = k, k_beta.neg()
        scores.mul_(_masks(c, k.dtype, k.device)[0])
    else:
        cum = decay.cumsum(-1)  # (B, c): log of the decay from the chunk's start
        # each span summed on its own (never c_i - c_j: it cancels, and is NaN at a decay of 0)
        gaps = decay_weights(decay[..., None])
        from_start = _exp_decay(cum)[..., None]
        to_end = _exp_decay(exclusive_suffix(decay, -1))[..., None]
        whole = _exp_decay(cum[:, -1:])[..., None]
        system.mul_(gaps), scores.mul_(gaps)
        q, keys, minus_writes = q * from_start, k * to_end, k_beta * from_start.neg()
    inverse = _inverse_unit_lower(system)
    values, minus_writes = inverse @ (v * beta), inverse @ minus_writes  # two products, no concat
    return (
        _Chunks(q, scores, values, minus_writes, keys, whole),
        _Solved(None if gaps is None else system, inverse, k_beta, gaps, from_start, to_end),
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
    return exp_(log_decay.masked_fill(log_decay < log_floor(log_decay.dtype), -torch.inf))


def _carry(p: _Chunks, state: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The state entering each chunk ((nc b h), dk, dv), what each chunk writes, u = values +
    minus_writes S ((nc b h), c, dv), and the final state ((b h), dk, dv): S' = a S + keys^T u,
    two products per chunk, written in place; the chunks walked in order (a loop over chunks)."""
    bh = state.shape[0]
    chunks = _per_chunk(bh, p.values, p.minus_writes, p.keys, p.decay)
    entering = state.new_empty(len(chunks) + 1, *state.shape)
    written = p.values.new_empty(len(chunks), bh, *p.values.shape[1:])
    entering[0] = state
    for (values, minus_writes, keys, decay), s, u, leaving in zip(
        chunks, entering, written, entering[1:]
    ):
        torch.baddbmm(values, minus_writes, s, out=u)
        if decay is None:
            leaving.copy_(s)
        else:
            torch.mul(s, decay, out=leaving)
        leaving.baddbmm_(keys.mT, u)
    return entering[:-1].flatten(0, 1), written.flatten(0, 1), entering[-1].clone()


def _carry_back(
    chunk: tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None], d_o: Tensor, d: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """The gradients of what each chunk writes ((nc b h), c, dv), of the state leaving each
    ((nc b h), dk, dv) and of the state entering the first ((b h), dk, dv), from each chunk's
    (scores, queries, minus_writes, keys, decay), the outputs' gradients and that of the state
    leaving the last (d), the chunks walked last first:
    du = scores^T do + keys dS', dS = a dS' + queries^T do + minus_writes^T du."""
    scores, queries, *walked = chunk
    bh = d.shape[0]
    d_written = (scores.mT @ d_o).unflatten(0, (-1, bh))  # scores^T do, then du in place
    leaving = d.new_empty(d_written.shape[0] + 1, *d.shape)  # [i]: entering chunk i
    torch.bmm(queries.mT, d_o, out=leaving[:-1].flatten(0, 1))  # queries^T do, then dS in place
    leaving[-1] = d  # leaving the last
    for (minus_writes, keys, decay), du, d_entering, d_leaving in reversed(
        list(zip(_per_chunk(bh, *walked), d_written, leaving, leaving[1:]))
    ):
        du.baddbmm_(keys, d_leaving)
        if decay is None:
            d_entering.add_(d_leaving)
        else:
            d_entering.addcmul_(d_leaving, decay)
        d_entering.baddbmm_(minus_writes.mT, du)
    return d_written.flatten(0, 1), leaving[1:].flatten(0, 1), leaving[0].clone()


def _even(starts: Tensor, bh: int) -> Tensor:
    """The states entering the even chunks (ceil(nc / 2), (b h), dk, dv) of those entering every
    chunk ((nc b h), dk, dv): what the backward keeps, half the memory."""
    return starts.unflatten(0, (-1, bh))[::2].clone(memory_format=torch.contiguous_format)


def _every_start(
    even: Tensor, values: Tensor, minus_writes: Tensor, keys: Tensor, decay: Tensor | None
) -> Tensor:
    """The states entering every chunk ((nc b h), dk, dv) from those entering the even ones
    (`_even`) and the chunks' ((nc b h), *, *) parts: S_2i+1 = a S_2i + keys^T (values +
    minus_writes S_2i), every odd chunk at once (the carry's products, batched)."""
    bh = even.shape[1]
    nc = values.shape[0] // bh
    odd = nc // 2

    def before_odd(t: Tensor) -> Tensor:  # the even chunks with an odd one after them
        return t.unflatten(0, (nc, bh))[0 : 2 * odd : 2].flatten(0, 1)

    state = even[:odd].flatten(0, 1)
    written = torch.baddbmm(before_odd(values), before_odd(minus_writes), state)
    after = state if decay is None else state * before_odd(decay)
    every = even.new_empty(nc, bh, *even.shape[2:])
    every[0::2] = even
    every[1::2] = torch.baddbmm(after, before_odd(keys).mT, written).unflatten(0, (odd, bh))
    return every.flatten(0, 1)


def _per_chunk(bh: int, *tensors: Tensor | None) -> list[tuple[Tensor | None, ...]]:
    """((nc b h), ...) tensors -> for each chunk, every head at once ((b h), ...) (None stays
    None)."""
    split = [None if t is None else t.unflatten(0, (-1, bh)).unbind(0) for t in tensors]
    count = next(len(t) for t in split if t is not None)
    return list(zip(*(([None] * count) if t is None else t for t in split)))
