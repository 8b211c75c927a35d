"""Routed attention through FlexAttention: the route's key blocks become the BlockMask's kv lists
per (batch, head, query tile), and the mask_mod compares a key's block with each query's K chosen
ones (never an n x n mask); its shapes depend on the length only, so the compiled kernel is
reused across inputs."""

from __future__ import annotations

import torch
from torch import Tensor

from ..flex import TILE, BlockMask, run_flex, tiles
from .route import Route, near


def route_block_mask(route: Route, n: int, real: Tensor) -> BlockMask:
    """The block mask of a forward route over n positions (offset 0): a query tile lists every
    key tile one of its queries selected; inside them, a key counts when its block is one of the
    query's, it is not after the query and it is real."""
    b, h = route.blocks.shape[:2]
    c, device = route.block, route.blocks.device
    nq = tiles(n)
    # key tiles each selected block spans: a block of c keys covers at most ceil(c / TILE) + 1
    span = -(-c // TILE) + 1
    first = route.blocks * c // TILE
    cover = first[..., None] + torch.arange(span, device=device)
    last = (route.blocks * c + c - 1).clamp(max=n - 1)[..., None] // TILE
    keep = route.used[..., None] & (cover <= last)
    pad = nq * TILE - n  # queries past n select nothing
    cover = torch.nn.functional.pad(torch.where(keep, cover, nq), (0, 0, 0, 0, 0, pad), value=nq)
    listed = torch.zeros(b, h, nq, nq + 1, dtype=torch.bool, device=device)
    listed.scatter_(-1, cover.reshape(b, h, nq, -1), True)
    listed = listed[..., :nq]
    counts = listed.sum(-1).to(torch.int32)
    order = listed.to(torch.int8).argsort(dim=-1, descending=True, stable=True).to(torch.int32)
    # each query's blocks, -1 in unused slots: K per query, not an (n, blocks) table
    chosen = torch.where(route.used, route.blocks, -1).to(torch.int32)
    last_q, slots, window = n - 1, chosen.shape[-1], route.window  # plain values: none guarded

    def mod(bi: Tensor, hi: Tensor, i: Tensor, j: Tensor) -> Tensor:
        row, block = i.clamp(max=last_q), j // c
        hit = chosen[bi, hi, row, 0] == block
        for slot in range(1, slots):  # the slots one by one: a mask_mod reads scalars
            hit = hit | (chosen[bi, hi, row, slot] == block)
        return hit & near(j, i, window) & real[bi, j.clamp(max=last_q)] & (j < n)

    return BlockMask.from_kv_blocks(
        counts, order, BLOCK_SIZE=TILE, mask_mod=mod, seq_lengths=(n, n)
    )


def routed_flex(q: Tensor, k: Tensor, v: Tensor, route: Route, real: Tensor) -> Tensor:
    """(b, h, n, d) queries, (b, kv, n, d) keys and values -> (b, h, n, d_v) through
    FlexAttention (compiled on CUDA, eager elsewhere); a query with no key gets zeros."""
    block_mask = route_block_mask(route, q.shape[2], real)
    return run_flex(q, k, v, block_mask, scale=q.shape[-1] ** -0.5)[0]
