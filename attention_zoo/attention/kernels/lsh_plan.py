"""The attention pattern of one LSH forward: sorted order, chunk windows, bucket masks, self rule.

Kept by the fused kernel's forward and reused by its backward; the materialised reference reads
the same masks.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..base import mask_value, self_mask_value
from .chunked import Windows, Workspace
from .rows import RoundPass

EPS = 1e-6  # as dense.unit_keys


@dataclass(frozen=True)
class LSHPlan:
    """Everything about one forward's sorting and windows, reused by backward."""

    chunk: int
    before: int
    after: int
    causal: bool
    groups: list[tuple[int, int]]
    perm: Tensor  # (b, h, r, npad): sorted index -> position
    sorted_buckets: Tensor  # (b, h, r, npad)
    # what the fused Function reads of every plan: score scale, unit-key epsilon (None: keys as
    # given), whether the caller's own position is left to a self partial (see `with_self`)
    scale: float = 1.0
    key_eps: float | None = EPS
    self_partial: bool = True

    def make_pass(self, s: int, e: int, shape: tuple[int, ...], ws: Workspace) -> LSHPass:
        return LSHPass(self, s, e, shape, ws)

    def forward_plan(self) -> LSHPlan:
        """The plan the fused forward runs: exact causal windows in quarter-chunk query blocks."""
        return self.regrid(self.forward_block())

    def windows(self, rows: int, npad: int, d: int) -> Windows:
        return Windows(
            chunk=self.chunk,
            before=self.before,
            after=self.after,
            length=rows * npad,
            to_heads=lambda x: x.unsqueeze(1),
        )

    def masks(
        self, s: int, e: int, win: Windows, dtype: torch.dtype, ws: Workspace | None = None
    ) -> BucketMasks:
        """Additive masks for rounds s:e in sorted order (see `BucketMasks`)."""
        sb = self.sorted_buckets[:, :, s:e]
        rows, npad = sb.shape[0] * sb.shape[1] * sb.shape[2], sb.shape[-1]
        return BucketMasks(self, win, sb.reshape(rows, npad), dtype, ws)

    def self_scale(self, dtype: torch.dtype) -> None:
        """A query that sees only itself gets exactly its value (see `CircularPlan.self_scale`)."""
        return None

    def regrid(self, block: int) -> LSHPlan:
        """The same attention pattern with query blocks of `block` positions (exact causal only).

        Exact causal windows slide with the query ([p - chunk * before, p] in sorted order), so
        blocks of `block` queries with `chunk * before / block` previous blocks cover them, and
        the masks keep the same bound. Smaller query blocks shrink the window each block scans
        (block + chunk * before keys instead of (before + 1) * chunk), and with it the float mask
        the fused kernel needs: at chunk 64, one before, 16-query blocks scan 80 keys, not 128.
        """
        if not self.causal or block == self.chunk:
            return self
        if self.chunk % block:
            raise ValueError(f"query block {block} does not divide chunk {self.chunk}")
        return dataclasses.replace(
            self, chunk=block, before=self.before * (self.chunk // block), after=0
        )

    def forward_block(self) -> int:
        """Query block of the fused forward: a quarter chunk (>= 8) when the pattern allows."""
        if not self.causal:
            return self.chunk
        block = self.chunk // 4
        return block if block >= 8 and self.chunk % 4 == 0 else self.chunk


class BucketMasks:
    """Additive masks of LSH windows, per window offset (rows * chunks, 1, c, c) or whole (.., W).

    Keys of another bucket are masked (a missing neighbour chunk carries bucket -1); causal keeps
    sorted offsets -before*c <= key - query <= 0 (within the bucket, where sorted order is
    position order). Self is masked here and added back
    as its own partial (see `with_self`). With a workspace, every per-offset mask is written into
    the same buffer (only for kernels that are done with the previous one).
    """

    def __init__(
        self, plan: LSHPlan, win: Windows, sb: Tensor, dtype: torch.dtype, ws: Workspace | None
    ) -> None:
        rows, npad = sb.shape
        self.plan, self.win, self.dtype, self.ws = plan, win, dtype, ws
        self.keys = torch.nn.functional.pad(sb, (win.front, win.back), value=-1)
        self.queries = sb.view(rows, npad // win.chunk, win.chunk, 1)
        self.length = npad

    def _fill(self, keys: Tensor, delta: Tensor, out: Tensor | None, name: str) -> Tensor:
        """where(same bucket, position pattern, masked) for keys (rows, chunks, K), delta (c, K)."""
        plan = self.plan
        mv = torch.tensor(mask_value(self.dtype), dtype=self.dtype, device=delta.device)
        bad = delta == 0
        if plan.causal:
            bad = bad | (delta > 0) | (delta < -self.win.front)
        pattern = torch.zeros(delta.shape, dtype=self.dtype, device=delta.device).masked_fill(
            bad, mv
        )
        rows, chunks, c, width = (*self.queries.shape[:3], delta.shape[1])
        if out is None:
            full = (rows * chunks, 1, c, width)
            out = pattern.new_empty(full) if self.ws is None else self.ws.get(name, full, pattern)
        torch.where(
            self.queries == keys.unsqueeze(2), pattern, mv, out=out.view(rows, chunks, c, width)
        )
        return out

    def __call__(self, o: int, out: Tensor | None = None) -> Tensor:
        """Offset o's block: keys of the chunk `o - before` chunks from the query's."""
        c = self.win.chunk
        t = torch.arange(c, device=self.keys.device)
        keys = self.keys[:, o * c : o * c + self.length].view(*self.queries.shape[:2], c)
        return self._fill(keys, (o - self.win.before) * c + t[None, :] - t[:, None], out, "mask")

    def window(self) -> Tensor:
        """Whole windows (rows * chunks, 1, c, W), for the fused forward's single call."""
        c, width = self.win.chunk, self.win.width
        device = self.keys.device
        keys = self.keys.unfold(1, width, c)  # (rows, chunks, W): overlapping views, no copy
        w, t = torch.arange(width, device=device), torch.arange(c, device=device)
        return self._fill(keys, w[None, :] - self.win.front - t[:, None], None, "window_mask")


class LSHPass(RoundPass):
    """A pass of the exact plan: flat windows over (b, h, g) rows, zero chunks at the ends."""

    def __init__(
        self, plan: LSHPlan, s: int, e: int, shape: tuple[int, ...], ws: Workspace
    ) -> None:
        super().__init__(plan.perm, s, e, ws)
        b, h, npad, d = shape
        self.win = plan.windows(b * h * self.g, npad, d)
        self.plan, self.s, self.e = plan, s, e

    def masks(self, dtype: torch.dtype) -> BucketMasks:
        return self.plan.masks(self.s, self.e, self.win, dtype, self.ws)

    def key_index(self, o: int) -> Tensor:
        """Flat positions of the keys at window offset o, slot by slot.

        The key block of offset o starts `shift` sorted slots after its query block; an index
        that wraps around lands on a nonexistent key, whose gradient is exactly 0."""
        shift = (o - self.win.before) * self.win.chunk
        return self.positions if shift == 0 else torch.roll(self.positions, -shift)

    def inputs(
        self, q_rows, k_rows, rk: Tensor, v_rows, shared: bool
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Sorted queries (flat), unit keys and values in long buffers (zero chunks at the ends)."""
        d = q_rows[0].shape[-1]
        q_flat = self.sort(q_rows, "q")
        k_long, k_mid = self.ws.long("k", self.win, (d,), q_flat)
        rk_sorted = rk.view(-1)[self.positions].unsqueeze(-1)
        if shared:  # keys are the queries scaled to unit length: no second gather
            torch.mul(q_flat, rk_sorted, out=k_mid)
        else:
            self.sort(k_rows, out=k_mid).mul_(rk_sorted)
        v_long, v_mid = self.ws.long("v", self.win, (d,), q_flat)
        self.sort(v_rows, out=v_mid)
        return q_flat, k_long, v_long


def self_lse(dtype: torch.dtype, rounds: int) -> float:
    """Log-weight of a query's own key: once per round, its score replaced by the self penalty.
    (HF's windows may hold more copies; the share it gives is 0 or 1 all the same, and
    `CircularPlan.self_scale` gives HF's weight where it is 1.)"""
    return self_mask_value(dtype) + math.log(rounds)


def self_weight(lse: Tensor, dtype: torch.dtype, rounds: int) -> Tensor:
    """Share of the self partial next to the kernels' log-sum-exp `lse` (without self)."""
    return torch.sigmoid(self_lse(dtype, rounds) - lse)


def with_self(
    out: Tensor,
    lse: Tensor,
    v: Tensor,
    rounds: int,
    *,
    dropout: float = 0.0,
    scale: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Fold the self partial (output v, fixed score) into a combined (out, lse, weight of v).

    The kernels mask self entirely; adding it back here with its exact replaced score keeps the
    1e5-sized penalty out of the kernels' float arithmetic (where one rounding step is ~0.01) while
    matching the Reformer rule: self counts only when nothing else is allowed. The shares are
    sigmoids of the difference, not exponentials of a combined log-sum-exp near -1e5 (whose
    float32 rounding would scale a query that sees only itself by up to 1 +- 0.004), unless
    `scale` (b, h, n) brings that rounding back: HF semantics reproduce HF's result. The weight
    of v returned is before dropout.
    """
    total = torch.logaddexp(lse, torch.full_like(lse, self_lse(v.dtype, rounds)))
    share = self_weight(lse, v.dtype, rounds)
    keep = (1 - share).unsqueeze(-1).to(out.dtype)
    weight = share if scale is None else share * scale
    own = weight.unsqueeze(-1).to(out.dtype)
    if dropout:  # the self probability is dropped like any other
        own = torch.nn.functional.dropout(own, dropout)
    return out * keep + v * own, total, weight
