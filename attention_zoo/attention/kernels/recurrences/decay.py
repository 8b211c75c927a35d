"""Decay-gated linear recurrences in chunks: S_t = diag(a_t) S_{t-1} + k_t v_t^T, o_t = scale
S_t^T q_t, a_t = exp(log_decay_t) a scalar per head and token (RetNet; Mamba2's SSD, fla's "simple
GLA") or a vector over key channels (GLA, Yang et al. 2024), or a_t = 1 (linear attention).

Within a chunk of C tokens everything is C x C and C x d products (Yang et al. 2024, section 4);
the state crosses chunks once per chunk. Every decay factor is the decay over a span of tokens,
exp of a sum <= 0 or a product of such, never a ratio: strong decays underflow, never overflow.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, linalg
from torch.nn import functional as F

from ..backward import hand_written_backward
from ..chunked import padded_length
from ..exp import LOG2_E, exp
from ..segments import SEGMENT_LENGTH, backward_segments, forward_segments, needs_grad, segments
from ..sums.plain import compute_dtype


def chunk_decay(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    log_decay: Tensor | None = None,
    *,
    scale: float,
    chunk_length: int = 64,
    initial_state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """q, k (b, h, n, dk), v (b, h, n, dv), log_decay (b, h, n) or (b, h, n, dk) (<= 0; None:
    no decay) -> o (b, h, n, dv) in q's dtype, final state (b, h, dk, dv) in compute_dtype
    (float32 for 16-bit inputs). Causal; with initial_state it is also the decoding step."""
    if chunk_length < 1 or chunk_length & (chunk_length - 1):
        raise ValueError(f"chunk_length must be a power of two, got {chunk_length}")
    if log_decay is not None and log_decay.dim() not in (3, 4):
        raise ValueError(f"log_decay must be (b, h, n) or (b, h, n, dk), got {log_decay.shape}")
    b, h, n, dk = k.shape
    wide = compute_dtype(q.dtype)
    if initial_state is None:
        state = q.new_zeros(b, h, dk, v.shape[-1], dtype=wide)
    else:
        state = initial_state.to(wide)
    if n == 1:  # the decoding step: the recurrence itself is cheapest
        return _step(q, k, v, log_decay, state, scale)
    # short inputs get one chunk of the next power of two, not a padded full chunk
    c = min(chunk_length, 1 << (n - 1).bit_length())
    bounds = segments(n, c, SEGMENT_LENGTH)
    inputs = (q, k, v, log_decay)
    if needs_grad(*inputs, state):
        return _SegmentedDecay.apply(*inputs, state, scale, c, bounds)
    o, _, state = _forward(inputs, state, scale, c, bounds)
    return o, state


def _step(
    q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor | None, state: Tensor, scale: float
) -> tuple[Tensor, Tensor]:
    """One token (n = 1) with plain autograd: S = a S + k v^T, o = scale S^T q."""
    dtype = q.dtype
    q, k, v = (t.to(state.dtype) for t in (q, k, v))
    if log_decay is not None:
        a = log_decay.to(state.dtype).exp()  # (b, h, 1) or (b, h, 1, dk)
        state = state * (a[..., None] if a.dim() == 3 else a.transpose(-1, -2))
    state = state + torch.matmul(k.transpose(-1, -2), v)
    return torch.matmul(q * scale, state).to(dtype), state


def _forward(
    inputs: tuple[Tensor, Tensor, Tensor, Tensor | None],
    state: Tensor,
    scale: float,
    c: int,
    bounds: list[tuple[int, int]],
) -> tuple[Tensor, list[Tensor], Tensor]:
    """The segments of (q, k, v, log_decay) in order: o in q's dtype, the state entering each
    segment, the final state."""
    q, _, v, _ = inputs
    o = q.new_empty(*q.shape[:-1], v.shape[-1])

    def segment(*x: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        return (*_segment(*x, scale, c), x[-1])  # its backward starts from the state entering

    entering, state = forward_segments(segment, inputs, state, bounds, o)
    return o, entering, state


class _SegmentedDecay(torch.autograd.Function):
    """Forward a segment at a time, keeping only the state entering each; the backward recomputes
    one segment's chunks at a time, last first, and differentiates them by hand into
    whole-sequence buffers: no chunk-sized intermediate outlives its segment, no graph is built."""

    @staticmethod
    def forward(ctx, q, k, v, log_decay, state, scale, c, bounds):
        o, entering, state = _forward((q, k, v, log_decay), state, scale, c, bounds)
        ctx.save_for_backward(q, k, v, log_decay, *entering)
        ctx.scale, ctx.c, ctx.bounds = scale, c, bounds
        return o, state

    @staticmethod
    @hand_written_backward
    def backward(ctx, do, dstate):
        q, k, v, log_decay, *entering = ctx.saved_tensors
        inputs = (q, k, v, log_decay)
        needs = ctx.needs_input_grad
        grads = [torch.empty_like(t) if need else None for t, need in zip(inputs, needs)]
        dstate = backward_segments(
            lambda *x: _segment_grads(*x, ctx.scale, ctx.c, needs[3]),
            inputs, do, entering, dstate, ctx.bounds, grads,
        )  # fmt: skip
        return (*grads, dstate if needs[4] else None, None, None, None)


def _segment(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    log_decay: Tensor | None,
    state: Tensor,
    scale: float,
    c: int,
) -> tuple[Tensor, Tensor]:
    """Tokens [start, stop) from the state entering them, in chunks of c: o (b, h, L, dv) and
    the state after them, in the state's dtype."""
    n = q.shape[2]
    q, k, v, g = _chunks(q, k, v, log_decay, state.dtype, scale, c)
    scores, into, out_of, _ = _within(q, k, g)
    own = torch.matmul(_times(k, out_of).transpose(-1, -2), v)  # (b, h, nc, dk, dv)
    entering, final = _carry(own, _chunk_decay(into), state)
    o = torch.matmul(scores, v) + torch.matmul(_times(q, into), entering)
    return o.flatten(2, 3)[:, :, :n], final


def _segment_grads(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    log_decay: Tensor | None,
    do: Tensor,
    state: Tensor,
    dstate: Tensor,
    scale: float,
    c: int,
    decay_grad: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor]:
    """The vector-Jacobian product of `_segment`: dq, dk, dv, d log_decay (when asked) and the
    gradient of the state entering, from do (b, h, L, dv) and that of the state leaving."""
    n = q.shape[2]
    q, k, v, g = _chunks(q, k, v, log_decay, state.dtype, scale, c)
    do = _chunked(do.to(state.dtype), q.shape[2] * c - n, c)  # q, k, v are in chunks now
    # each tensor is let go once read for the last time: they bound the segment's memory
    scores, into, out_of, (dq, dk) = _within(q, k, g, torch.matmul(do, v.transpose(-1, -2)))
    del g
    k_out, q_into, decay = _times(k, out_of), _times(q, into), _chunk_decay(into)
    entering, final = _carry(torch.matmul(k_out.transpose(-1, -2), v), decay, state)
    # the states' gradients, last chunk first: dS_entering = decay dS_leaving + (q into)^T do
    d_exits, d_entering = _carry_back(torch.matmul(q_into.transpose(-1, -2), do), decay, dstate)
    del q_into
    dv = torch.matmul(scores.transpose(-1, -2), do).add_(torch.matmul(k_out, d_exits))
    del scores, k_out
    dq += _times(torch.matmul(do, entering.transpose(-1, -2)), into)
    del do, into
    dk += _times(torch.matmul(v, d_exits.transpose(-1, -2)), out_of)
    del v, out_of
    dg = None
    if decay_grad:
        # q_t enters only as q_t exp(c_t), k_t as k_t exp(-c_t) and the state S leaving a chunk as
        # exp(c_last) (S_entering + sum_t k_t exp(-c_t) v_t^T), c the log decay from the chunk's
        # start: dL/dc_t = q_t dq_t - k_t dk_t, plus sum_v S dS at the chunk's last token, and
        # dL/dg_t sums dL/dc over the chunk's tokens from t on (fla's GLA does the same)
        dc = (q * dq).sub_(k * dk)
        last = dc[..., -1, :]  # the states leaving the chunks: those entering the next, the final
        last[:, :, :-1] += linalg.vecdot(entering[:, :, 1:], d_exits[:, :, :-1])
        last[:, :, -1] += linalg.vecdot(final, d_exits[:, :, -1])
        del entering, d_exits
        dg = dc.flip(-2).cumsum(-2).flip(-2).flatten(2, 3)[:, :, :n]
        del dc
        dg = dg.sum(-1) if log_decay.dim() == 3 else dg
    dq, dk, dv = (t.flatten(2, 3)[:, :, :n] for t in (dq.mul_(scale), dk, dv))
    return dq, dk, dv, dg, d_entering


def _chunks(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    log_decay: Tensor | None,
    dtype: torch.dtype,
    scale: float,
    c: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """q (scaled), k, v (b, h, nc, c, d) and log decays (b, h, nc, c, 1 or dk) in dtype, zero
    rows appended to whole chunks: zero keys and values, log decay 0, change nothing."""
    pad = padded_length(q.shape[2], c) - q.shape[2]
    q, k, v = (_chunked(t.to(dtype), pad, c) for t in (q * scale, k, v))
    if log_decay is None:
        return q, k, v, None
    g = log_decay.to(dtype)
    return q, k, v, _chunked(g[..., None] if g.dim() == 3 else g, pad, c)


def _chunked(t: Tensor, pad: int, c: int) -> Tensor:
    """(b, h, L, *) -> (b, h, nc, c, *), zero rows appended to whole chunks; contiguous, so the
    products fold (b, h, nc) into one batch without a copy each."""
    t = F.pad(t, (0, 0, 0, pad)) if pad else t.contiguous()
    return t.unflatten(2, (t.shape[2] // c, c))


def _times(x: Tensor, factor: Tensor | None) -> Tensor:
    return x if factor is None else x * factor


def _chunk_decay(into: Tensor | None) -> Tensor | None:
    """Each chunk's whole decay (b, h, nc, 1 or dk, 1): the decay into its last token."""
    return None if into is None else into[..., -1:, :].transpose(-1, -2)


def _carry(own: Tensor, decay: Tensor | None, state: Tensor) -> tuple[Tensor, Tensor]:
    """The states entering each chunk (b, h, nc, dk, dv) and the state leaving the last, from
    each chunk's own keys and values own (b, h, nc, dk, dv) and its decay (b, h, nc, 1|dk, 1).
    The chunks are walked with unbind, not indexed: a loop over chunks only."""
    entering = own.new_empty(own.shape)
    decays = [None] * own.shape[2] if decay is None else decay.unbind(2)
    for own_c, decay_c, into in zip(own.unbind(2), decays, entering.unbind(2)):
        into.copy_(state)
        state = own_c + _times(state, decay_c)
    return entering, state


def _carry_back(pushed: Tensor, decay: Tensor | None, d: Tensor) -> tuple[Tensor, Tensor]:
    """The gradients of the states leaving each chunk (b, h, nc, dk, dv) and of the state
    entering the first, from d (that of the state leaving the last) and each chunk's own part
    pushed (b, h, nc, dk, dv), walking the chunks last first."""
    d_exits = pushed.new_empty(pushed.shape)
    decays = [None] * pushed.shape[2] if decay is None else decay.unbind(2)
    walked = list(zip(pushed.unbind(2), decays, d_exits.unbind(2)))
    for pushed_c, decay_c, leaving in reversed(walked):
        leaving.copy_(d)
        d = pushed_c + _times(d, decay_c)
    return d_exits, d


def _suffix(g: Tensor) -> Tensor:
    """The log decay from each token to the end of its chunk, the token excluded: summed from the
    end and shifted, never a difference, which cancels (float32 keeps eps x |sum| of the
    exponent, and the sums reach hundreds under strong decays) and is NaN where a decay is 0."""
    return exclusive_suffix(g, -2)


def exclusive_suffix(g: Tensor, dim: int) -> Tensor:
    """Along `dim`: the sum of the entries after each one (0 after the last); -inf entries, decays
    of exactly 0, stay -inf rather than meeting another -inf in a difference."""
    inclusive = g.flip(dim).cumsum(dim).flip(dim)
    after = inclusive.narrow(dim, 1, g.shape[dim] - 1)
    return torch.cat([after, torch.zeros_like(g.narrow(dim, 0, 1))], dim)


def _within(
    q: Tensor, k: Tensor, g: Tensor | None, dscores: Tensor | None = None
) -> tuple[Tensor, Tensor | None, Tensor | None, tuple[Tensor, Tensor] | None]:
    """Each chunk's scores (b, h, nc, c, c), sum_d q_id k_jd (decay from j to i) for j <= i; the
    decays from the chunk's start into each token (itself included) and out of each token to the
    chunk's end (itself excluded), None without decays; given the scores' gradient dscores
    (consumed), the gradients of q and k (b, h, nc, c, dk)."""
    if g is not None and g.shape[-1] > 1:
        return _channel_within(q, k, g, dscores)
    scores = torch.matmul(q, k.transpose(-1, -2))
    if g is None:
        weights, into, out_of = None, None, None
        scores.tril_()
    else:
        weights, into, out_of = decay_weights(g), exp(g.cumsum(-2)), exp(_suffix(g))
        scores.mul_(weights)
    if dscores is None:
        return scores, into, out_of, None
    dscores = dscores.tril_() if weights is None else dscores.mul_(weights)
    grads = torch.matmul(dscores, k), torch.matmul(dscores.transpose(-1, -2), q)
    return scores, into, out_of, grads


def decay_weights(g: Tensor) -> Tensor:
    """exp(g_{j+1} + ... + g_i) for j <= i, else 0 (.., c, c), from log decays g (.., c, 1) <= 0.
    Each exponent sums its own span (Mamba2's segsum): no cancellation, no -inf - -inf. Weights
    below the square root of the smallest normal number are 0, never subnormal (slow on CPU)."""
    c, floor = g.shape[-2], log_floor(g.dtype)
    ones = torch.ones(c, c, dtype=g.dtype, device=g.device)
    # in base 2; g clamped at the floor: a span holding such a token is below it anyway
    spans = (g.clamp(min=floor) * LOG2_E * ones.tril(-1)).cumsum_(-2)  # [i, j]: g over (j, i]
    weights = F.threshold_(spans, floor * LOG2_E, -math.inf).exp2_()
    return weights.mul_(ones.tril_())  # float masks: products, faster than where or tril


def log_floor(dtype: torch.dtype) -> float:
    """The log of the square root of the smallest normal number of dtype: decays below it are 0."""
    return math.log(torch.finfo(dtype).tiny) / 2


def _channel_within(
    q: Tensor, k: Tensor, g: Tensor, dscores: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, tuple[Tensor, Tensor] | None]:
    """`_within` with a decay per key channel, c a power of two, by blocks of 1, 2, 4, ... tokens.

    The diagonal first (decay 1); then at each block size, where a block's later half meets its
    earlier half, the decay splits at the boundary between them: q_i times the decay from the
    boundary into i, k_j times the decay from j to the boundary. These decays are factors <= 1,
    merged by products as the blocks double (never exponentiated sums): nothing overflows and no
    exponent cancels, however strong the decay (fla's GLA splits chunks in sub-chunks likewise)."""
    c = q.shape[-2]
    scores = q.new_zeros(*q.shape[:-1], c)
    scores.diagonal(dim1=-2, dim2=-1).copy_(linalg.vecdot(q, k))
    if dscores is not None:
        d_diagonal = dscores.diagonal(dim1=-2, dim2=-1)[..., None]
        dq, dk = d_diagonal * k, d_diagonal * q
    # each token's decay from its block's start (itself included), to its block's end (excluded)
    into, out_of = g.exp(), torch.ones_like(g)
    half = 1
    while half < c:  # log2(c) block sizes, each over every block at once
        (_, q_late), (k_early, _) = _halves(q, half), _halves(k, half)
        (into_early, into_late), (out_early, _) = _halves(into, half), _halves(out_of, half)
        late, early = q_late * into_late, k_early * out_early
        _across(scores, half).copy_(torch.matmul(late, early.mT))
        if dscores is not None:
            d_across = _across(dscores, half).contiguous()  # read twice
            _halves(dq, half)[1].addcmul_(_small_matmul(d_across, early), into_late)
            _halves(dk, half)[0].addcmul_(_small_matmul(d_across.mT, late), out_early)
        # blocks double: an earlier half's tokens now end where the later half ends, a later
        # half's tokens start where the earlier half starts
        out_early.mul_(into_late[..., -1:, :])
        into_late.mul_(into_early[..., -1:, :])
        half *= 2
    return scores, into, out_of, None if dscores is None else (dq, dk)


def _small_matmul(a: Tensor, b: Tensor) -> Tensor:
    """a @ b; over an inner dimension of 1 or 2 as broadcast products, which cost less than a
    batched matmul of such small matrices."""
    if a.shape[-1] > 2:
        return torch.matmul(a, b)
    return (a.unsqueeze(-1) * b.unsqueeze(-3)).sum(-2)


def _halves(t: Tensor, half: int) -> tuple[Tensor, Tensor]:
    """The earlier and later halves of every block of 2 * half tokens along -2: views
    (..., blocks, half, *)."""
    return t.unflatten(-2, (-1, 2, half)).unbind(-3)


def _across(scores: Tensor, half: int) -> Tensor:
    """The block where each later half meets its earlier half, (..., blocks, half, half): a view
    of scores (..., c, c)."""
    blocks = scores.shape[-1] // (2 * half)
    grid = scores.unflatten(-1, (blocks, 2, half)).unflatten(-4, (blocks, 2, half))
    return grid.diagonal(dim1=-6, dim2=-3)[..., 1, :, 0, :, :].movedim(-1, -3)
