"""Chunked attention over windows that wrap around, as transformers' Reformer attends.

Per (batch, head) row, the attended sequence is the concatenation of R orderings of the padded
positions: R hash rounds sorted by bucket for LSH, the positions in order (R = 1) for local. It is
cut into chunks; each chunk attends to itself and `before` previous and `after` following chunks,
wrapping around the concatenation (HF's `_look_adjacent`): a round's first chunk sees the end of
the previous round, the first round's sees the last round's; an offset beyond the whole
concatenation is the chunk itself (HF's slices clamp). Masks depend on positions only: a
key is allowed when it is real and, causally, not after the query; with `self_partial` a query's
own position is left to a separate partial with HF's self score (see `lsh_plan.with_self`).
Rounds combine by their log-sum-exp, as HF sums its rounds.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..exp import exp_, logsumexp
from ..masks import additive_mask, mask_value, self_mask_value
from .rows import SlotPass, SlotPlan, undo_perm


@dataclass(frozen=True)
class CircularPlan(SlotPlan):
    """One forward's circular attention pattern, reused by the backward (see `RoundsFlash`)."""

    chunk: int
    before: int
    after: int
    causal: bool
    groups: list[tuple[int, int]]
    perm: Tensor  # (b, h, R, npad): slot of each round -> position
    key_real: Tensor  # (b, npad) bool: positions that are real keys
    scale: float
    key_eps: float | None  # keys * (|k|^2 + eps)^-1/2 (HF's shared-QK keys), None: as given
    self_partial: bool  # shared QK: own position scored apart, HF's self value

    def key_slots(self, slots: Tensor) -> Tensor:
        """Slots of the long buffers wrap around the concatenation of all rounds."""
        return slots % self.perm.shape[2:].numel()

    def pass_masks(self, p: SlotPass, dtype: torch.dtype) -> CircularMasks:
        return CircularMasks(self, p, dtype)

    def margins_masked(self, p: SlotPass) -> bool:
        """Never: the neighbour chunks are wrapped-around windows of their own."""
        return False

    @property
    def total_chunks(self) -> int:
        """Chunks in the concatenation of all rounds."""
        rounds, npad = self.perm.shape[2:]
        return rounds * npad // self.chunk

    def shifts(self) -> list[int]:
        """The chunk each window offset reaches, relative to the query's, as HF's `_look_adjacent`
        concatenates them: i chunks for |i| <= the concatenation's chunks, else the query's own
        chunk (its slices `[i:]`, `[:i]` clamp to the whole concatenation)."""
        total = self.total_chunks
        return [i if abs(i) <= total else 0 for i in range(-self.before, self.after + 1)]

    def shift_tensor(self, device: torch.device) -> Tensor:
        """shifts() made on `device` (no copy from the host, which a CUDA graph cannot capture)."""
        offsets = torch.arange(-self.before, self.after + 1, device=device)
        return offsets.masked_fill(offsets.abs() > self.total_chunks, 0)

    @property
    def consecutive(self) -> bool:
        """Every window is consecutive chunks (mod the concatenation): what the fused kernel's
        long buffers hold. Not so when an offset reaches past the whole concatenation."""
        return self.shifts() == list(range(-self.before, self.after + 1))

    def window_positions(self) -> Tensor:
        """(b * h, chunks, W): the position of every key slot of every query chunk's window."""
        b, h = self.perm.shape[:2]
        total, device = self.total_chunks, self.perm.device
        shifts = self.shift_tensor(device)
        chunks = (torch.arange(total, device=device)[:, None] + shifts) % total  # (total, nw)
        positions = self.perm.reshape(b * h, total, self.chunk)
        return positions[:, chunks].reshape(b * h, total, -1)

    def self_copies(self) -> Tensor:
        """(b, h, R, npad) int: how often each position's own slot is in its window, per round
        (the windows' chunks of every round, its own round's included)."""
        total, device = self.total_chunks, self.perm.device
        # how many of a window's chunks are d chunks after the query's, for every d
        reached = self.shift_tensor(device) % total
        per_offset = (torch.arange(total, device=device)[:, None] == reached).sum(1)
        per_offset = per_offset.to(torch.int32)
        chunk = (undo_perm(self.perm) // self.chunk).to(torch.int32)  # (b, h, R, npad)
        offset = (chunk.unsqueeze(2) - chunk.unsqueeze(3)) % total  # (b, h, R, R', npad)
        return per_offset[offset].sum(3)

    def self_scale(self, dtype: torch.dtype) -> Tensor:
        """(b, h, npad): what HF returns, in units of its value, for a query that sees only its
        own position in every round (the self partial's weight where it is the only one).

        HF replaces the score of every copy of the query's own position in its window by the self
        value and sums rounds by their log-sum-exp, in the vectors' dtype: in float32 (self value
        -1e5, one step 0.008 there) such a query gets its value times 1 +- 4e-3, in float64 once
        within rounding; in float16 (-1e3, steps of 0.5) and bfloat16 (-1e5 is -99840, steps of
        512: once per copy, summed over rounds) far from once. This is that factor, computed with
        HF's operations in `dtype`.
        """
        copies = self.self_copies().to(dtype)
        value = torch.full((), self_mask_value(dtype), dtype=dtype, device=self.perm.device)
        logits = value + torch.log(copies)  # HF's log-sum-exp of k self scores and masked ones
        per_round = copies * torch.exp(value - logits)
        weights = torch.exp(logits - torch.logsumexp(logits, dim=2, keepdim=True))
        return (per_round * weights).sum(2)

    def allowed(self, q_pos: Tensor, k_pos: Tensor, k_real: Tensor) -> Tensor:
        """Which (query, key) pairs the kernel attends, from positions (broadcasting)."""
        ok = k_real
        if self.causal:
            ok = ok & ((k_pos < q_pos) if self.self_partial else (k_pos <= q_pos))
        elif self.self_partial:
            ok = ok & (k_pos != q_pos)
        return ok


class CircularMasks:
    """Additive masks of a pass: whole windows (rows, chunks, c, W) or per offset (.., c, c)."""

    def __init__(self, plan: CircularPlan, p: SlotPass, dtype: torch.dtype) -> None:
        b, h, _, npad = plan.perm.shape
        win, c = p.win, plan.chunk
        self.plan, self.win, self.dtype, self.ws = plan, win, dtype, p.ws
        self.q_pos = p.q_pos.reshape(win.rows, -1, c, 1)
        self.k_pos = p.long_pos  # (rows, long length)
        real = plan.key_real[:, None].expand(b, h, npad).reshape(b * h, npad)
        self.k_real = torch.gather(real, 1, self.k_pos)

    def _fill(self, k_pos: Tensor, k_real: Tensor, name: str) -> Tensor:
        ok = self.plan.allowed(self.q_pos, k_pos.unsqueeze(2), k_real.unsqueeze(2))
        like = torch.zeros((), dtype=self.dtype, device=ok.device)
        return additive_mask(ok, self.dtype, out=self.ws.get(name, ok.shape, like))

    def __call__(self, o: int) -> Tensor:
        """Offset o's block: keys of the chunk `o - before` chunks from the query's."""
        win = self.win
        k_pos = self.k_pos.narrow(1, o * win.chunk, win.row_length).view(win.rows, -1, win.chunk)
        k_real = self.k_real.narrow(1, o * win.chunk, win.row_length).view(k_pos.shape)
        return self._fill(k_pos, k_real, "mask")

    def window(self) -> Tensor:
        """Whole windows, for the fused forward's single call."""
        width, c = self.win.width, self.win.chunk
        return self._fill(
            self.k_pos.unfold(1, width, c), self.k_real.unfold(1, width, c), "window_mask"
        )


def consecutive_reason(cfg: Any, length: int, rounds: int = 1) -> str | None:
    """Why the fused kernel cannot run HF's wrapped windows over `rounds` sorted rounds of a
    length-long sequence, or None: its buffers hold consecutive chunks only, and a window that
    reaches past every chunk of the rounds is clamped by HF (the materialised path computes it).
    `cfg` has semantics, chunk_length, num_chunks_before and num_chunks_after."""
    if cfg.semantics != "hf" or length <= cfg.chunk_length:
        return None
    chunks = rounds * -(-length // cfg.chunk_length)
    if max(cfg.num_chunks_before, cfg.num_chunks_after) > chunks:
        return (
            f"HF-semantics windows reach past all {chunks} chunks of the rounds (HF clamps those "
            "offsets): materialised only"
        )
    return None


def empty_rows(plan: CircularPlan) -> Tensor:
    """(b, h, R * npad, 1) bool: queries whose whole window holds no allowed key."""
    b, h, rounds, npad = plan.perm.shape
    k_pos = plan.window_positions()  # (rows, chunks, W)
    k_real = _key_real(plan, k_pos).unsqueeze(2)
    q_pos = plan.perm.reshape(b * h, -1, plan.chunk, 1)
    ok = plan.allowed(q_pos, k_pos.unsqueeze(2), k_real)
    return ~ok.any(-1).expand(q_pos.shape[:-1]).reshape(b, h, rounds * npad, 1)


def _key_real(plan: CircularPlan, k_pos: Tensor) -> Tensor:
    """Whether the key at each of k_pos's (b * h, ...) positions is real."""
    b, h, _, npad = plan.perm.shape
    real = plan.key_real[:, None].expand(b, h, npad).reshape(b * h, npad)
    return torch.gather(real, 1, k_pos.reshape(b * h, -1)).view(k_pos.shape)


def window_means(v: Tensor, plan: CircularPlan) -> Tensor:
    """(b, h, npad, d): each query's mean value over its window, for one round in position
    order -- what HF's softmax gives a query whose every key is masked (all scores equal)."""
    b, h, npad, d = v.shape
    c, shifts = plan.chunk, plan.shifts()
    sums = v.reshape(b, h, npad // c, c, d).sum(3)  # per chunk
    total = sum(torch.roll(sums, -shift, dims=2) for shift in shifts)  # a handful of offsets
    mean = total / (len(shifts) * c)
    return mean.unsqueeze(3).expand(b, h, npad // c, c, d).reshape(b, h, npad, d)


HF_KEY_EPS = 1e-6  # hf_keys = k * (|k|^2 + d * HF_KEY_EPS)^-1/2


def hf_keys(k: Tensor) -> Tensor:
    """HF's shared-QK keys (`_len_and_dim_norm`): k / sqrt(mean(k^2) + HF_KEY_EPS) / sqrt(d)."""
    d = k.shape[-1]
    return k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + HF_KEY_EPS) / math.sqrt(d)


def circular_math(
    q: Tensor, k: Tensor, v: Tensor, plan: CircularPlan, *, dropout: float = 0.0
) -> Tensor:
    """HF's computation itself, materialised (every round's windows at once, plain autograd):
    the reference, the CUDA path and the path with attention dropout.

    Masked scores are replaced (not offset) by the mask value and, with `self_partial`, a
    query's own position by the self value, then softmax, dropout, and rounds summed by their
    log-sum-exp weights, exactly as HF's LSHSelfAttention / LocalSelfAttention.
    """
    b, h, rounds, npad = plan.perm.shape
    d, c = q.shape[-1], plan.chunk
    keys = hf_keys(k) if plan.key_eps is not None else k
    pos = plan.perm.reshape(b * h, rounds * npad)
    k_pos = plan.window_positions()  # (rows, chunks, W)

    def rows_of(x: Tensor, index: Tensor) -> Tensor:
        flat = x.reshape(b * h, npad, d)
        return torch.gather(flat, 1, index.reshape(b * h, -1, 1).expand(-1, -1, d))

    q4 = rows_of(q, pos).view(b * h, -1, c, d)
    kw = rows_of(keys, k_pos).view(*k_pos.shape, d)
    vw = rows_of(v, k_pos).view(*k_pos.shape, d)
    scores = torch.matmul(q4, kw.transpose(-1, -2)) * plan.scale  # (rows, chunks, c, W)
    q_pos = pos.view(b * h, -1, c, 1)
    k_real = _key_real(plan, k_pos).unsqueeze(2)
    hf_plan = dataclasses.replace(plan, self_partial=False)  # HF: mask, then the self value
    ok = hf_plan.allowed(q_pos, k_pos.unsqueeze(2), k_real)
    scores = scores.masked_fill(~ok, mask_value(q.dtype))
    if plan.self_partial:
        scores = scores.masked_fill(k_pos.unsqueeze(2) == q_pos, self_mask_value(q.dtype))
    lse = logsumexp(scores, dim=-1, keepdim=True)
    probs = exp_(scores - lse)
    if dropout:
        probs = torch.nn.functional.dropout(probs, dropout)
    out = torch.matmul(probs, vw).reshape(b, h, rounds * npad, d)
    undo = undo_perm(plan.perm).view(b, h, rounds * npad)
    out = torch.gather(out, 2, undo[..., None].expand(-1, -1, -1, d)).view(b, h, rounds, npad, d)
    lse = torch.gather(lse.reshape(b, h, rounds * npad), 2, undo).view(b, h, rounds, npad)
    weights = torch.exp(lse - torch.logsumexp(lse, dim=2, keepdim=True))  # HF's, not softmax
    return (out * weights.unsqueeze(-1)).sum(2)
