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

from ..dense import KEY_EPS
from ..masks import additive_mask, mask_value, self_mask_value
from .rows import SlotPass, SlotPlan


@dataclass(frozen=True)
class LSHPlan(SlotPlan):
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
    key_eps: float | None = KEY_EPS
    self_partial: bool = True

    def forward_plan(self) -> LSHPlan:
        """The plan the fused forward runs: exact causal windows in quarter-chunk query blocks."""
        return self.regrid(self.forward_block())

    def key_slots(self, slots: Tensor) -> Tensor:
        """Slots beyond a row's ends are clamped (a real key, masked by `BucketMasks`)."""
        return slots.clamp(0, self.perm.shape[2:].numel() - 1)

    def codes(self, start: int, stop: int) -> Tensor:
        """(b * h, stop - start): bucket and round of slots start:stop in one number (bucket * R
        + round), so that one comparison asks for the same bucket in the same round; -1 for
        slots beyond the ends (the range is static: a slice and a pad, no gather)."""
        b, h, rounds, npad = self.sorted_buckets.shape
        total = rounds * npad
        lo, hi = max(start, 0), min(stop, total)
        codes = self.sorted_buckets.view(b * h, total)[:, lo:hi]
        if rounds > 1:
            codes = codes * rounds + torch.arange(lo, hi, device=codes.device) // npad
        return torch.nn.functional.pad(codes, (lo - start, stop - hi), value=-1)

    def margins_masked(self, p: SlotPass) -> bool:
        """Whether every key beyond the pass's own slots is masked for all its queries: so for a
        pass of whole rounds (another round's keys or none)."""
        return p.whole_rounds

    def pass_masks(self, p: SlotPass, dtype: torch.dtype) -> BucketMasks:
        """Additive masks of one pass's slots (see `BucketMasks`)."""
        return BucketMasks(self, p, dtype)

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
    """Additive masks of a pass's LSH windows: per window offset (rows, chunks, c, c) or whole
    (rows, chunks, c, W).

    Keys of another bucket or round are masked (a slot beyond the row's ends carries code -1);
    causal keeps sorted offsets -before*c <= key - query <= 0 (within the bucket, where sorted
    order is position order). Self is masked here and added back as its own partial (see
    `with_self`). With the pass's workspace, every per-offset mask is written into the same
    buffer (only for kernels that are done with the previous one).
    """

    def __init__(self, plan: LSHPlan, p: SlotPass, dtype: torch.dtype) -> None:
        win = p.win
        self.plan, self.win, self.dtype, self.ws = plan, win, dtype, p.ws
        self.keys = plan.codes(p.start - win.front, p.stop + win.back)  # (rows, long length)
        queries = self.keys.narrow(1, win.front, win.row_length)
        self.queries = queries.reshape(win.rows, -1, win.chunk, 1)

    def _fill(self, keys: Tensor, delta: Tensor, name: str) -> Tensor:
        """where(same code, position pattern, masked) for keys (rows, chunks, K), delta (c, K)."""
        mv = torch.full((), mask_value(self.dtype), dtype=self.dtype, device=delta.device)
        bad = delta == 0
        if self.plan.causal:
            bad = bad | (delta > 0) | (delta < -self.win.front)
        pattern = additive_mask(~bad, self.dtype)
        shape = (*self.queries.shape[:3], delta.shape[1])
        out = self.ws.get(name, shape, pattern)
        return torch.where(self.queries == keys.unsqueeze(2), pattern, mv, out=out)

    def __call__(self, o: int) -> Tensor:
        """Offset o's block: keys of the chunk `o - before` chunks from the query's."""
        win, c = self.win, self.win.chunk
        t = torch.arange(c, device=self.keys.device)
        keys = self.keys.narrow(1, o * c, win.row_length).view(*self.queries.shape[:2], c)
        return self._fill(keys, (o - win.before) * c + t[None, :] - t[:, None], "mask")

    def window(self) -> Tensor:
        """Whole windows (rows, chunks, c, W), for the fused forward's single call."""
        c, width = self.win.chunk, self.win.width
        device = self.keys.device
        keys = self.keys.unfold(1, width, c)  # (rows, chunks, W): overlapping views, no copy
        w, t = torch.arange(width, device=device), torch.arange(c, device=device)
        return self._fill(keys, w[None, :] - self.win.front - t[:, None], "window_mask")


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
