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


@dataclass(frozen=True)
class LSHPlan:
    """Everything about one forward's sorting and windows, reused by backward."""

    chunk: int
    before: int
    after: int
    causal: bool
    hf: bool
    groups: list[tuple[int, int]]
    perm: Tensor  # (b, h, r, npad): sorted index -> position
    sorted_buckets: Tensor  # (b, h, r, npad)

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

    def regrid(self, block: int) -> LSHPlan:
        """The same attention pattern with query blocks of `block` positions (exact causal only).

        Exact causal windows slide with the query ([p - chunk * before, p] in sorted order), so
        blocks of `block` queries with `chunk * before / block` previous blocks cover them, and
        the masks keep the same bound. Smaller query blocks shrink the window each block scans
        (block + chunk * before keys instead of (before + 1) * chunk), and with it the float mask
        the fused kernel needs: at chunk 64, one before, 16-query blocks scan 80 keys, not 128.
        """
        if not self.causal or self.hf or block == self.chunk:
            return self
        if self.chunk % block:
            raise ValueError(f"query block {block} does not divide chunk {self.chunk}")
        return dataclasses.replace(
            self, chunk=block, before=self.before * (self.chunk // block), after=0
        )

    def forward_block(self) -> int:
        """Query block of the fused forward: a quarter chunk (>= 8) when the pattern allows."""
        if not self.causal or self.hf:
            return self.chunk
        block = self.chunk // 4
        return block if block >= 8 and self.chunk % 4 == 0 else self.chunk


class BucketMasks:
    """Additive masks of LSH windows, per window offset (rows * chunks, 1, c, c) or whole (.., W).

    Keys of another bucket are masked (a missing neighbour chunk carries bucket -1); causal:
    exact keeps sorted offsets -before*c <= key - query <= 0, HF-style only key <= query (both
    within the bucket, where sorted order is position order). Self is masked here and added back
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
            bad = bad | (delta > 0)
            if not plan.hf:
                bad = bad | (delta < -self.win.front)
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


def self_lse(dtype: torch.dtype, rounds: int) -> float:
    """Log-weight of a query's own key: once per round, its score replaced by the self penalty."""
    return self_mask_value(dtype) + math.log(rounds)


def self_weight(lse: Tensor, dtype: torch.dtype, rounds: int) -> Tensor:
    return torch.exp(self_lse(dtype, rounds) - lse)


def with_self(out: Tensor, lse: Tensor, v: Tensor, rounds: int) -> tuple[Tensor, Tensor]:
    """Fold the self partial (output v, fixed score) into a combined (out, lse).

    The kernels mask self entirely; adding it back here with its exact replaced score keeps the
    1e5-sized penalty out of the kernels' float arithmetic (where one rounding step is ~0.01) while
    matching the Reformer rule: self counts only when nothing else is allowed.
    """
    total = torch.logaddexp(lse, torch.full_like(lse, self_lse(v.dtype, rounds)))
    keep = torch.exp(lse - total).unsqueeze(-1).to(out.dtype)
    own = self_weight(total, v.dtype, rounds).unsqueeze(-1).to(out.dtype)
    return out * keep + v * own, total
