"""NSA's compressed branch and its router (Yuan et al. 2025): queries attend to the mean-pooled
key blocks they may see (mean pooling as fla does; the paper learns an MLP), and the probabilities
of that attention, summed over a group of shared-KV query heads, choose the blocks to read."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from ...dispatch import expand_kv
from ..masks import additive_mask
from .route import ROUTE_BYTES, Route, top_blocks


def visible(positions: Tensor, has: Tensor, block: int) -> Tensor:
    """(b, t, nb) bool: compressed block c is seen by the query at position p once it is complete,
    (c + 1) block - 1 <= p, and holds a real key."""
    c = torch.arange(has.shape[1], device=has.device)
    return ((c + 1) * block - 1 <= positions[:, None])[None] & has[:, None, :]


def compressed_attention(
    q: Tensor, keys: Tensor, values: Tensor, has: Tensor, *, block: int, offset: int = 0
) -> tuple[Tensor, Tensor]:
    """q (b, h, t, d) at positions offset.. over the pooled keys and values (b, kv, nb, d) they
    see -> (b, h, t, d_v), and (b, 1, t) whether each query sees one (where not, the output is
    finite and meaningless: the caller's gate zeroes it). Segments of queries are recomputed in
    the backward, so no (t, nb) mask is kept for it."""
    t = q.shape[2]
    positions = torch.arange(offset, offset + t, device=q.device)
    parts = [
        checkpoint(compressed_part, q[:, :, s:e], keys, values, has, positions[s:e], block,
                   use_reentrant=False, preserve_rng_state=False)
        for s, e in query_spans(q, has)
    ]  # fmt: skip
    out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)
    return out, compressed_seen(has, t, block=block, offset=offset)


def compressed_seen(has: Tensor, t: int, *, block: int, offset: int = 0) -> Tensor:
    """(b, 1, t): whether each of t queries at positions offset.. sees a complete pooled block
    that holds a real key."""
    nb = has.shape[1]
    positions = torch.arange(offset, offset + t, device=has.device)
    real_before = F.pad(has.long().cumsum(-1), (1, 0))  # (b, nb + 1): real blocks among the first
    return (real_before[:, ((positions + 1) // block).clamp(max=nb)] > 0)[:, None]


def query_spans(q: Tensor, has: Tensor) -> list[tuple[int, int]]:
    """The segments of queries whose compressed scores (b, h, step, nb) fit ROUTE_BYTES: static,
    from the shapes."""
    b, h, t, _ = q.shape
    step = max(1, ROUTE_BYTES // (b * h * has.shape[1] * 4))
    return [(s, min(s + step, t)) for s in range(0, t, step)]


def compressed_part(
    q: Tensor, keys: Tensor, values: Tensor, has: Tensor, positions: Tensor, block: int
) -> Tensor:
    """compressed_attention's output for queries q at `positions` (a finite mask value: a query
    that sees no block averages them all)."""
    ok = visible(positions, has, block)[:, None]  # (b, 1, t, nb)
    return F.scaled_dot_product_attention(
        q,
        keys,
        values,
        attn_mask=additive_mask(ok, q.dtype),
        enable_gqa=keys.shape[1] != q.shape[1],
    )


def nsa_route(
    q: Tensor, means: Tensor, has: Tensor, *, block: int, slots: int, offset: int = 0
) -> Route:
    """The blocks of queries q (b, h, t, d) at positions offset..: the first, the previous and
    their own block, and the slots - 3 others with the highest compressed-attention probability
    summed over the query heads sharing a KV head (means (b, kv, nb, d)); a group's heads read the
    same blocks."""
    b, h, t, d = q.shape
    kv, nb = means.shape[1], means.shape[2]
    positions = torch.arange(offset, offset + t, device=q.device)
    own = positions // block
    step = max(1, ROUTE_BYTES // (b * h * nb * 4))
    picks, used = [], []
    with torch.no_grad():  # indices only
        for s in range(0, t, step):  # bounds the (queries, blocks) probabilities held at once
            e = min(s + step, t)
            q_s = q[:, :, s:e].to(means.dtype).reshape(b, kv, -1, e - s, d)
            scores = torch.matmul(q_s, means.unsqueeze(2).transpose(-1, -2)) * d**-0.5
            ok = visible(positions[s:e], has, block)[:, None, None]  # (b, 1, 1, e - s, nb)
            probs = scores.masked_fill(~ok, float("-inf")).softmax(-1)
            importance = torch.where(ok, probs, 0.0).sum(2)  # (b, kv, e - s, nb)
            j = torch.arange(nb, device=q.device)
            mine = own[s:e, None]
            forced = (j == 0) | (j == mine) | (j == mine - 1)
            candidate = ok[:, 0, 0].unsqueeze(1) & ~forced
            idx, found = top_blocks(importance.masked_fill(~candidate, float("-inf")), slots - 3)
            picks.append(idx)
            used.append(found)
    first = torch.zeros_like(own)
    fixed = torch.stack([first, (own - 1).clamp(min=0), own], -1).expand(b, kv, t, 3)
    fixed_used = torch.stack([first == 0, own >= 2, own >= 1], -1).expand(b, kv, t, 3)
    blocks = torch.cat([fixed, torch.cat(picks, dim=2)], dim=-1)
    used = torch.cat([fixed_used, torch.cat(used, dim=2)], dim=-1)
    q_heads = q[:, :, :1, :1]  # the group's heads share their KV head's blocks
    return Route(expand_kv(q_heads, blocks), expand_kv(q_heads, used), block, offset)


def window_route(
    b: int, h: int, t: int, *, block: int, window: int, offset: int, device: torch.device
) -> Route:
    """The sliding-window branch as a route: the blocks holding the `window` keys up to each
    query (the same for every head)."""
    own = torch.arange(offset, offset + t, device=device) // block
    back = (window - 1) // block + 2  # blocks a window of keys can touch
    blocks = own[:, None] - torch.arange(back - 1, -1, -1, device=device)
    used = blocks >= 0
    shape = (b, h, t, back)
    return Route(blocks.clamp(min=0).expand(shape), used.expand(shape), block, offset, window)
