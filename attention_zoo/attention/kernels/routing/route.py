"""A router's answer, read by every implementation: the key blocks each (batch, head, query)
attends, a fixed number K per query (unused slots flagged), causal inside the blocks.

Queries are routed one by one, as MoBA and NSA do: a query block routed by its pooled queries
would let a later token change what an earlier one attends (not causal, and not decodable).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..sums.plain import compute_dtype

# Routing scores of a pass over queries: bounds the (queries, blocks) scores held at once
ROUTE_BYTES = 8 << 20


@dataclass(frozen=True)
class Route:
    """Key blocks (b, h, t, K) long of `block` positions each, for t queries at positions
    offset.. offset + t - 1; `used` (b, h, t, K) bool says which slots count (no repeats).
    With a `window`, a query sees only keys less than `window` positions back."""

    blocks: Tensor
    used: Tensor
    block: int
    offset: int = 0
    window: int | None = None

    def near(self, key: Tensor, query: Tensor) -> Tensor:
        """Bool, broadcasting: the key is at or before the query (and inside the window)."""
        return near(key, query, self.window)

    def positions(self) -> Tensor:
        """(t,) long: the queries' positions."""
        t = self.blocks.shape[2]
        return torch.arange(self.offset, self.offset + t, device=self.blocks.device)


def near(key: Tensor, query: Tensor, window: int | None) -> Tensor:
    """Bool, broadcasting: the key is at or before the query, and less than `window` back."""
    ok = key <= query
    return ok if window is None else ok & (key > query - window)


def block_means(k: Tensor, real: Tensor, block: int) -> tuple[Tensor, Tensor]:
    """Mean of each block's real keys, (b, kv, nb, d) in the score dtype, and which blocks hold a
    real key (b, nb); a last partial block is averaged over the keys it has."""
    b, kv, n, d = k.shape
    nb = -(-n // block)
    pad = nb * block - n
    weight = F.pad(real, (0, pad)).to(compute_dtype(k.dtype)).view(b, 1, nb, block, 1)
    blocks = F.pad(k.to(weight.dtype), (0, 0, 0, pad)).view(b, kv, nb, block, d)
    count = weight.sum(-2)  # (b, 1, nb, 1)
    return (blocks * weight).sum(-2) / count.clamp(min=1), count[:, 0, :, 0] > 0


def add_block_means_grad(acc: Tensor, grad: Tensor, real: Tensor, block: int) -> None:
    """acc (b, kv, nb, block, d), keys laid out in whole blocks, += the gradient of `block_means`
    (its means' gradient grad (b, kv, nb, d)): each real key gets its block's share."""
    b, _, nb, _, _ = acc.shape
    pad = nb * block - real.shape[1]
    weight = F.pad(real, (0, pad)).to(acc.dtype).view(b, 1, nb, block, 1)
    count = weight.sum(-2).clamp(min=1)  # (b, 1, nb, 1)
    acc.addcmul_((grad.to(acc.dtype) / count).unsqueeze(-2), weight)


def as_blocks(x: Tensor, block: int) -> Tensor:
    """(b, kv, L, e) -> (b kv nb, block e): one row per block, zero-padded to whole blocks (a view
    when L is a multiple of the block and x is laid out so)."""
    length, e = x.shape[-2:]
    pad = -length % block
    x = F.pad(x, (0, 0, 0, pad)) if pad else x
    return x.reshape(-1, block * e)


def from_blocks(x: Tensor, like: Tensor) -> Tensor:
    """Rows of blocks (b kv nb, block e) -> (b, kv, L, e) with `like`'s length and dtype."""
    b, kv, length, e = like.shape
    return x.view(b, kv, -1, e)[:, :, :length].to(like.dtype)


def top_blocks(scores: Tensor, slots: int) -> tuple[Tensor, Tensor]:
    """The `slots` best blocks of scores (..., nb) (-inf: not a candidate) and which are real
    candidates; a static count whatever the candidates."""
    slots = min(slots, scores.shape[-1])
    if slots == 0:
        empty = scores.new_zeros(*scores.shape[:-1], 0)
        return empty.long(), empty.bool()
    values, idx = scores.topk(slots, dim=-1)
    return idx, values > float("-inf")


def token_mask(route: Route, n: int, real: Tensor) -> Tensor:
    """(b, h, t, n) bool: the keys each query may see under `route`: in a used block, at or
    before the query, real. The dense reference's mask: O(t n), for short inputs."""
    b, h, t, _ = route.blocks.shape
    nb = -(-n // route.block)
    picked = torch.zeros(b, h, t, nb + 1, dtype=torch.bool, device=route.blocks.device)
    picked.scatter_(-1, torch.where(route.used, route.blocks, nb), True)
    j = torch.arange(n, device=picked.device)
    seen = picked[..., j // route.block] & route.near(j, route.positions()[:, None])
    return seen & real[:, None, None, :]
