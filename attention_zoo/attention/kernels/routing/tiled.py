"""Routed attention grouped by key block (MoBA's efficient form, with static shapes): every
(query, slot) pair is sorted by the block it reads, the pairs of one block packed into tiles of
TILE queries, and each tile is one (TILE x block) product against its block; the pairs' partial
softmaxes are merged per query by their log-sum-exp.

A block is read once per tile (not once per query), so keys are gathered about pairs / TILE
times instead of pairs times. Tiles per (batch, head) are at most pairs / TILE + blocks + 1 (each
block's last tile may be partial): a count from the shapes, so the shapes never depend on the
routing. Tiles run a segment at a time: the forward makes each tile's scores once, merging them
into each query's running maximum, sum and weighted values (an online softmax, rescaled as the
maximum grows); it saves q, k, v, the output, the log-sum-exp and one int32 query position per
tile slot, and the backward recomputes each segment's rows, key positions and probabilities.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd import Function

from ..backward import hand_written_backward
from ..exp import exp_
from ..masks import mask_value
from ..sums.plain import compute_dtype
from .route import Route, as_blocks, from_blocks

TILE = 64  # queries per tile: one product of (TILE x d) by (d x block)
SCRATCH_BYTES = 16 << 20  # a segment of tiles' scores, probabilities and gathered blocks
FAR = 1 << 62  # a position after every query


def _plan(route: Route, nb: int) -> tuple[Tensor, Tensor]:
    """(b, h, tiles, TILE) the pair each tile slot holds (pairs: the sentinel, none) and
    (b, h, tiles) the block each tile reads (nb: none)."""
    b, h, t, slots = route.blocks.shape
    pairs = t * slots
    blocks = torch.where(route.used, route.blocks, nb).reshape(b, h, pairs)
    order = torch.argsort(blocks, dim=-1, stable=True)  # by block, then query
    sorted_blocks = torch.gather(blocks, -1, order)
    count = torch.zeros(b, h, nb + 1, dtype=torch.long, device=blocks.device)
    count.scatter_add_(-1, blocks, torch.ones_like(blocks))
    count[..., nb] = 0  # unused pairs get no tile
    tiles_of = -(-count // TILE)
    first_tile = tiles_of.cumsum(-1) - tiles_of
    first_pair = count.cumsum(-1) - count
    rank = torch.arange(pairs, device=blocks.device) - torch.gather(first_pair, -1, sorted_blocks)
    tile = torch.gather(first_tile, -1, sorted_blocks) + rank // TILE
    n_tiles = pairs // TILE + nb + 1
    real = sorted_blocks < nb
    slot = torch.where(real, tile * TILE + rank % TILE, n_tiles * TILE)  # spare slot at the end
    holder = torch.full((b, h, n_tiles * TILE + 1), pairs, dtype=torch.long, device=blocks.device)
    holder.scatter_(-1, slot, order)
    reads = torch.full((b, h, n_tiles + 1), nb, dtype=torch.long, device=blocks.device)
    reads.scatter_(-1, torch.where(real, tile, n_tiles), sorted_blocks)
    return holder[..., :-1].view(b, h, n_tiles, TILE), reads[..., :-1]


class Tiles:
    """One call's tiles: which queries and which key block each holds, gathered a segment at a
    time from flat (b h t, d) queries and (b kv nb, c d) blocks (views where the layout allows;
    an empty tile slot reads a real row, masked). Kept for the backward, so it holds one small
    integer per tile slot (the query's position) and derives the rows and key positions of a
    segment when it is read."""

    def __init__(
        self,
        route: Route,
        real: Tensor,
        q: Tensor,
        k: Tensor,
        pairs: Tensor,
        reads: Tensor,
        scratch: int = SCRATCH_BYTES,
    ) -> None:
        """pairs (b, h, T, TILE), reads (b, h, T): `_plan`'s; scratch: bytes a segment may hold."""
        b, h, self.t, _ = q.shape
        kv, length = k.shape[1], k.shape[2]
        self.c, self.slots, self.offset = route.block, route.blocks.shape[-1], route.offset
        self.nb, self.reads = -(-length // self.c), reads
        used = pairs < self.t * self.slots
        # (b, h, T, TILE): the query position each slot holds, -1 for an empty slot (it then
        # sees no key); int32, since it is kept for the backward
        self.query_pos = torch.where(used, route.offset + pairs // self.slots, -1).int()
        bi = torch.arange(b, device=q.device)[:, None, None]
        hi = torch.arange(h, device=q.device)[None, :, None]
        self.first_row = ((bi * h + hi) * self.t)[..., None]  # (b, h, 1, 1): row of query 0
        self.block_rows = (bi * kv + hi // (h // kv)) * self.nb + self.reads.clamp(max=self.nb - 1)
        self.real = F.pad(real, (0, (self.nb + 1) * self.c - length))  # (b, (nb + 1) c)
        self.window, self.scratch = route.window, scratch
        self.shape, self.length = (b, h, kv), length

    def query_rows(self, s: int, e: int) -> Tensor:
        """(b, h, e - s, TILE) the flat row of each slot's query in tiles s:e (an empty slot:
        query 0's)."""
        return self.first_row + (self.query_pos[:, :, s:e].long() - self.offset).clamp_(min=0)

    def key_pos(self, s: int, e: int) -> Tensor:
        """(b, h, e - s, c) the position of each key tiles s:e read, FAR for a padding key: one
        comparison then masks each pair's keys (a padding key sits after every query, an empty
        slot's query before every key)."""
        pos = self.reads[:, :, s:e, None] * self.c + torch.arange(self.c, device=self.real.device)
        bi = torch.arange(pos.shape[0], device=pos.device)[:, None, None, None]
        return torch.where(self.real[bi, pos], pos, FAR)

    def segments(self, width: int) -> list[tuple[int, int]]:
        b, h, _ = self.shape
        per_tile = b * h * (TILE * self.c * 4 + 2 * self.c * width + 2 * TILE * width) * 8
        n, step = self.reads.shape[-1], max(1, self.scratch // per_tile)
        return [(s, min(s + step, n)) for s in range(0, n, step)]

    def rows(self, flat: Tensor, rows: Tensor, per_row: int) -> Tensor:
        """The rows of flat picked by rows (b, h, tiles, ...): (b, h, tiles, -1, per_row)."""
        picked = flat.index_select(0, rows.reshape(-1))
        return picked.view(*rows.shape[:3], -1, per_row)

    def scores(self, q_flat: Tensor, k_flat: Tensor, s: int, e: int, scale: float):
        """Tiles s:e: their query rows (b, h, e - s, TILE), queries (.., TILE, d), keys (.., c,
        d) and masked scores (.., TILE, c)."""
        d = q_flat.shape[-1]
        rows = self.query_rows(s, e)
        queries = self.rows(q_flat, rows, d)
        keys = self.rows(k_flat, self.block_rows[:, :, s:e], d)
        key_pos, query_pos = self.key_pos(s, e)[..., None, :], self.query_pos[:, :, s:e, :, None]
        hidden = key_pos > query_pos
        if self.window is not None:
            hidden = hidden | (key_pos <= query_pos - self.window)
        scores = torch.matmul(queries, keys.transpose(-1, -2)).mul_(scale)
        return rows, queries, keys, scores.masked_fill_(hidden, mask_value(scores.dtype))


def tiled_forward(
    q: Tensor, k: Tensor, v: Tensor, tiles: Tiles, scale: float
) -> tuple[Tensor, Tensor]:
    """The routed softmax's output (b, h, t, d_v) and log-sum-exp (b, h, t), in the score dtype
    (a query that sees no key: output 0, lse 0)."""
    wide = compute_dtype(q.dtype)
    b, h, t, d = q.shape
    dv = v.shape[-1]
    q_flat = q.to(wide).reshape(b * h * t, d)
    k_flat, v_flat = as_blocks(k.to(wide), tiles.c), as_blocks(v.to(wide), tiles.c)
    floor = mask_value(wide)
    # per query: the largest score so far, and the sum of exp(score - it) and its weighted
    # values, rescaled as it grows (online softmax: each tile's scores are made once)
    top = q.new_full((b * h * t,), floor, dtype=wide)
    total = q.new_zeros(b * h * t, dtype=wide)
    out = q.new_zeros(b * h * t, dv, dtype=wide)
    for s, e in tiles.segments(max(d, dv)):
        rows, _, _, scores = tiles.scores(q_flat, k_flat, s, e, scale)
        rows = rows.reshape(-1)
        pair_top = scores.amax(-1)  # (b, h, e - s, TILE): floor exactly where it sees no key
        # such a pair's probabilities are 0, not 1 over the masked keys: it adds nothing
        shift = torch.where(pair_top > floor, pair_top, torch.inf)
        p = exp_(scores.sub_(shift[..., None]))
        values = tiles.rows(v_flat, tiles.block_rows[:, :, s:e], dv)
        part, part_total = torch.matmul(p, values).reshape(-1, dv), p.sum(-1).reshape(-1)
        pair_top = pair_top.reshape(-1)
        before = top[rows]  # a query in two tiles of the segment: the same row twice
        top.scatter_reduce_(0, rows, pair_top, "amax")
        after = top[rows]
        keep, weight = exp_(before.sub_(after)), exp_(pair_top.sub_(after))
        out.index_copy_(0, rows, out[rows].mul_(keep[:, None]))
        total.index_copy_(0, rows, total[rows].mul_(keep))
        out.index_add_(0, rows, part.mul_(weight[:, None]))
        total.index_add_(0, rows, part_total.mul_(weight))
        del p, values, part
    # a query that sees no key gets lse 0 and output 0: in the backward its scores, all the
    # mask value, then give probabilities of exactly 0, so its share of every gradient is 0
    seen = top > floor  # masked scores are floor exactly; a real one above it counts
    lse = torch.where(seen, top + total.log(), 0.0).view(b, h, t)
    out = out.div_(total[:, None]).masked_fill_(~seen[:, None], 0.0).view(b, h, t, dv)
    return out, lse


def tiled_backward(
    g: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    lse: Tensor,
    delta: Tensor,
    tiles: Tiles,
    scale: float,
    grads: tuple[Tensor, Tensor, Tensor],
    gate: Tensor | None = None,
) -> None:
    """Add the gradients of a routed softmax's output to grads = (dq (b h t, d), dk and dv in
    `as_blocks` rows), in the score dtype. The output's gradient is g (b, h, t, d_v) times the
    optional per-query gate (b, h, t); delta (b, h, t) is rowsum(that gradient * output)."""
    wide = lse.dtype
    b, h, t, d = q.shape
    dv = v.shape[-1]
    q_flat, g_flat = q.to(wide).reshape(b * h * t, d), g.to(wide).reshape(b * h * t, dv)
    k_flat, v_flat = as_blocks(k.to(wide), tiles.c), as_blocks(v.to(wide), tiles.c)
    lse_flat, delta = lse.reshape(-1), delta.reshape(-1)
    gate = None if gate is None else gate.to(wide).reshape(-1)
    grad_q, grad_k, grad_v = grads
    for s, e in tiles.segments(max(d, dv)):
        rows, queries, keys, scores = tiles.scores(q_flat, k_flat, s, e, scale)
        p = exp_(scores.sub_(lse_flat[rows][..., None]))  # (b, h, e - s, TILE, c)
        block_rows = tiles.block_rows[:, :, s:e]
        values = tiles.rows(v_flat, block_rows, dv)
        outer = tiles.rows(g_flat, rows, dv)
        if gate is not None:
            outer.mul_(gate[rows][..., None])
        ds = torch.matmul(outer, values.transpose(-1, -2))
        ds = ds.sub_(delta[rows][..., None]).mul_(p).mul_(scale)
        blocks = block_rows.reshape(-1)
        grad_q.index_add_(0, rows.reshape(-1), torch.matmul(ds, keys).reshape(-1, d))
        grad_k.index_add_(
            0, blocks, torch.matmul(ds.transpose(-1, -2), queries).reshape(blocks.numel(), -1)
        )
        grad_v.index_add_(
            0, blocks, torch.matmul(p.transpose(-1, -2), outer).reshape(blocks.numel(), -1)
        )
        del queries, keys, p, values, outer, ds  # before the next segment's are made


def zero_grads(q: Tensor, k: Tensor, v: Tensor, block: int) -> tuple[Tensor, Tensor, Tensor]:
    """Zeroed accumulators for `tiled_backward`: dq (b h t, d), dk and dv in `as_blocks` rows
    (b kv nb, block e), in the score dtype."""
    wide = compute_dtype(q.dtype)
    b, h, t, d = q.shape
    nb = -(-k.shape[2] // block)
    rows = b * k.shape[1] * nb
    return (
        q.new_zeros(b * h * t, d, dtype=wide),
        k.new_zeros(rows, block * k.shape[-1], dtype=wide),
        v.new_zeros(rows, block * v.shape[-1], dtype=wide),
    )


class TiledRouted(Function):
    """softmax over the routed keys by key-block tiles; see the module docstring."""

    @staticmethod
    def forward(ctx, q, k, v, tiles, scale):  # type: ignore[override]
        out, lse = tiled_forward(q, k, v, tiles, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.tiles, ctx.scale = tiles, scale
        return out.to(q.dtype)

    @staticmethod
    @hand_written_backward
    def backward(ctx, g):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        delta = torch.linalg.vecdot(g.to(lse.dtype), out)
        grads = zero_grads(q, k, v, ctx.tiles.c)
        tiled_backward(g, q, k, v, lse, delta, ctx.tiles, ctx.scale, grads)
        grad_q, grad_k, grad_v = grads
        grad_q = grad_q.view(q.shape).to(q.dtype)
        return grad_q, from_blocks(grad_k, k), from_blocks(grad_v, v), None, None


def tiled_attention(q: Tensor, k: Tensor, v: Tensor, route: Route, real: Tensor) -> Tensor:
    """q (b, h, t, d) at the route's positions, keys and values (b, kv, L, d) at 0..L-1, real
    (b, L) -> (b, h, t, d_v): softmax(q k^T / sqrt(d)) v over the routed keys."""
    return TiledRouted.apply(q, k, v, plan_tiles(route, real, q, k), q.shape[-1] ** -0.5)


def plan_tiles(
    route: Route, real: Tensor, q: Tensor, k: Tensor, scratch: int = SCRATCH_BYTES
) -> Tiles:
    """The tiles that compute `route` for queries q over keys k (real (b, L) their real keys),
    a segment of at most `scratch` bytes at a time."""
    pairs, reads = _plan(route, -(-k.shape[2] // route.block))
    return Tiles(route, real, q, k, pairs, reads, scratch)
