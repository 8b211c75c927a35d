"""Block-sparse softmax attention: every query block attends to a static number of gathered key
blocks, masked within them by the pattern's mask_mod (BigBird; sliding window with global tokens).

Query block i gathers the key blocks `layout.blocks[i]` (the same count K for every block, unused
slots masked), so scores are (blocks, block, K * block): memory linear in n. The token mask comes
from the pattern's mask_mod, the function the dense `pattern(n)` also reads, so kernel and pattern
agree by construction. Query rows that see every key (global tokens) are attended densely:
(rows, n) scores, still linear in n. PyTorch's fused CPU kernel runs a segment of query blocks
at a time, forward and backward (`BlockSparseFlash`: only one segment's gathered blocks exist at
once); the materialised path gives SDPA every block at once with autograd (dropout, any device).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd import Function

from ..backward import hand_written_backward
from ..cpu_flash import flash_backward, flash_forward
from ..masks import MaskMod, additive_mask, real_positions


@dataclass(frozen=True)
class BlockLayout:
    """Which key blocks each query block gathers: (blocks, K) indices, and which slots count."""

    block: int  # positions per block
    blocks: Tensor  # (nb, K) long: the key block in each slot
    used: Tensor  # (nb, K) bool: slots inside the sequence and not a repeat of an earlier slot

    @classmethod
    def of(cls, block: int, blocks: Tensor, used: Tensor) -> BlockLayout:
        """A layout from candidate slots: drops those outside the sequence and repeats (a key
        gathered twice would count twice in the softmax)."""
        nb, slots = blocks.shape
        used = used & (blocks >= 0) & (blocks < nb)
        same = blocks[:, :, None] == blocks[:, None, :]  # (nb, K, K): slot s equals slot t
        earlier = torch.ones(slots, slots, dtype=torch.bool, device=blocks.device).tril(-1)
        repeat = (same & earlier & used[:, None, :]).any(-1)
        return cls(block, blocks.clamp(0, nb - 1), used & ~repeat)


# Query blocks are attended a segment at a time, forward and backward, each segment one
# vectorised call: the gathered keys and values (and, backward, their gradients) of as many blocks
# as fit in SCRATCH_BYTES exist at once, and never fewer than one block, so scratch is at most
# max(SCRATCH_BYTES, one block's) at any length. The Python loop over segments is what bounds
# the memory; its count comes from shapes only (no data), so the meta device and torch.compile
# (fullgraph, the loop unrolled) still hold. It is faster than one segment too.
SCRATCH_BYTES = 2 << 20  # a larger budget was no faster and raised forward peaks


def _segments(nb: int, block_bytes: int) -> list[tuple[int, int]]:
    """Query-block ranges [s, e) of at most SCRATCH_BYTES of scratch (at least one block each),
    `block_bytes` per block."""
    step = max(1, min(nb, SCRATCH_BYTES // block_bytes))
    return [(s, min(s + step, nb)) for s in range(0, nb, step)]


class _Blocks:
    """One call's geometry: padded (b, h, npad, d) tensors, gathered a segment at a time."""

    def __init__(
        self, layout: BlockLayout, mod: MaskMod, real: Tensor, shape: tuple[int, ...]
    ) -> None:
        self.layout, self.mod, self.real = layout, mod, real  # real: (b | 1, npad)
        self.b, self.h, self.npad, self.d = shape
        self.c = layout.block
        self.slots = layout.blocks.shape[1]

    def scratch_bytes(self, itemsize: int, backward: bool) -> int:
        """One query block's scratch: gathered keys and values (backward: and their gradients)
        and its mask."""
        keys = self.slots * self.c
        per_row = (2 + 2 * backward) * self.h * keys * self.d + self.c * keys
        return self.b * per_row * itemsize

    def key_positions(self, s: int, e: int) -> Tensor:
        """(e - s, 1, K c): the positions of the keys gathered for query blocks s:e."""
        c, device = self.c, self.layout.blocks.device
        return (self.layout.blocks[s:e, :, None] * c + torch.arange(c, device=device)).view(
            e - s, 1, -1
        )

    def rows(self, s: int, e: int) -> Tensor:
        """Rows of a flat (b * h * npad, d) tensor holding those keys, in (b, e-s, h, K c) order."""
        b, h, device = self.b, self.h, self.layout.blocks.device
        base = torch.arange(b * h, device=device).view(b, 1, h, 1) * self.npad
        return (base + self.key_positions(s, e)[None]).reshape(-1)

    def mask(self, s: int, e: int, dtype: torch.dtype) -> Tensor:
        """Additive mask (b (e - s) | e - s, 1, c, K c) of query blocks s:e."""
        c, kpos = self.c, self.key_positions(s, e)
        qpos = torch.arange(s * c, e * c, device=kpos.device).view(e - s, c, 1)
        used = self.layout.used[s:e].repeat_interleave(c, dim=1)[:, None, :]
        ok = self.mod(qpos, kpos) & used & self.real[..., kpos]  # (b|1, e - s, c, K c)
        ok = ok.expand(self.b, e - s, c, kpos.shape[-1]).reshape(-1, 1, c, kpos.shape[-1])
        return additive_mask(ok, dtype)

    def rows_mask(self, rows: int, dtype: torch.dtype) -> Tensor:
        """Additive mask (b|1, 1, rows, npad) of the first `rows` queries over every key."""
        keys = torch.arange(self.npad, device=self.layout.blocks.device)
        ok = self.mod(keys[:rows, None], keys[None, :]) & self.real[..., None, :]
        return additive_mask(ok.reshape(-1, 1, rows, self.npad), dtype)

    def queries(self, x: Tensor, s: int, e: int) -> Tensor:
        """Query blocks s:e of a padded (b, h, npad, d) tensor as (b (e - s), h, c, d)."""
        part = x[:, :, s * self.c : e * self.c].reshape(self.b, self.h, e - s, self.c, -1)
        return part.transpose(1, 2).reshape(-1, self.h, self.c, part.shape[-1])

    def gather(self, flat: Tensor, s: int, e: int) -> Tensor:
        """Keys (or values) of query blocks s:e: (b (e - s), h, K c, d), one copy."""
        picked = torch.index_select(flat, 0, self.rows(s, e))
        return picked.view(-1, self.h, self.slots * self.c, self.d)

    def put(self, dst: Tensor, blocks: Tensor, s: int, e: int) -> None:
        """dst (b, h, npad, d)[query blocks s:e] = blocks (b (e - s), h, c, ...)."""
        b, h, c = self.b, self.h, self.c
        view = dst[:, :, s * c : e * c].view(b, h, e - s, c, *dst.shape[3:])
        view.copy_(blocks.view(b, e - s, h, c, *blocks.shape[3:]).transpose(1, 2))


def _flat(x: Tensor) -> Tensor:
    b, h, n, d = x.shape
    return x.reshape(b * h * n, d)


class BlockSparseFlash(Function):
    """Gathered key blocks through PyTorch's fused CPU kernel, a segment of query blocks at a time,
    and the global rows over every key; saves q, k, v, the output and the log-sum-exp only.

    The backward regathers each segment. The global rows' backward runs a segment of keys at a
    time: given the whole row's output and log-sum-exp, the kernel's backward over some keys
    returns exactly their share of the gradient (see chunked.flash_backward_offset)."""

    @staticmethod
    def forward(ctx, q, k, v, geo, scale, global_rows):  # type: ignore[override]
        out = torch.empty_like(q)
        lse = q.new_empty(q.shape[:3], dtype=torch.float32 if q.dtype.itemsize < 4 else q.dtype)
        k_flat, v_flat = _flat(k), _flat(v)
        for s, e in _segments(geo.layout.blocks.shape[0], geo.scratch_bytes(q.itemsize, False)):
            o, m = flash_forward(
                geo.queries(q, s, e), geo.gather(k_flat, s, e), geo.gather(v_flat, s, e),
                0.0, False, attn_mask=geo.mask(s, e, q.dtype), scale=scale,
            )  # fmt: skip
            geo.put(out, o, s, e)
            geo.put(lse, m.to(lse.dtype), s, e)
        if global_rows:  # their block results are replaced: these rows see every key
            rows, mask = slice(0, global_rows), geo.rows_mask(global_rows, q.dtype)
            o, m = flash_forward(q[:, :, rows], k, v, 0.0, False, attn_mask=mask, scale=scale)
            out[:, :, rows], lse[:, :, rows] = o, m.to(lse.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.geo, ctx.scale, ctx.global_rows = geo, scale, global_rows
        return out

    @staticmethod
    @hand_written_backward
    def backward(ctx, g):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        geo, scale, global_rows = ctx.geo, ctx.scale, ctx.global_rows
        dq = torch.empty_like(q)
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        k_flat, v_flat, dk_flat, dv_flat = (_flat(t) for t in (k, v, dk, dv))
        segments = _segments(geo.layout.blocks.shape[0], geo.scratch_bytes(q.itemsize, True))
        for s, e in segments:
            g_s = geo.queries(g, s, e)
            if global_rows > s * geo.c:  # the global rows' gradient is not from their blocks
                first = torch.arange(s * geo.c, e * geo.c, device=g.device) < global_rows
                g_s = g_s * ~first.view(e - s, 1, geo.c, 1).repeat(geo.b, 1, 1, 1)
            dq_s, dk_s, dv_s = flash_backward(
                g_s, geo.queries(q, s, e), geo.gather(k_flat, s, e), geo.gather(v_flat, s, e),
                geo.queries(out, s, e), geo.queries(lse.unsqueeze(-1), s, e).squeeze(-1),
                0.0, False, attn_mask=geo.mask(s, e, q.dtype), scale=scale,
            )  # fmt: skip
            geo.put(dq, dq_s, s, e)
            rows = geo.rows(s, e)
            dk_flat.index_add_(0, rows, dk_s.reshape(-1, dk_s.shape[-1]))
            dv_flat.index_add_(0, rows, dv_s.reshape(-1, dv_s.shape[-1]))
        if global_rows:
            rows, mask = slice(0, global_rows), geo.rows_mask(global_rows, q.dtype)
            for s, e in segments:
                keys = slice(s * geo.c, e * geo.c)
                dq_r, dk_r, dv_r = flash_backward(
                    g[:, :, rows], q[:, :, rows], k[:, :, keys], v[:, :, keys], out[:, :, rows],
                    lse[:, :, rows], 0.0, False, attn_mask=mask[..., keys], scale=scale,
                )  # fmt: skip
                dq[:, :, rows] += dq_r
                dk[:, :, keys] += dk_r
                dv[:, :, keys] += dv_r
        return dq, dk, dv, None, None, None


def block_sparse_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    layout: BlockLayout,
    mod: MaskMod,
    *,
    global_rows: int,
    key_padding_mask: Tensor | None,
    scale: float,
    dropout: float,
    fused: bool,
) -> Tensor:
    """(b, h, n, d) x3 -> (b, h, n, d): softmax over the keys `mod` allows, gathered by `layout`
    (which must cover them) for rows >= global_rows, over all n keys for the first global_rows.
    fused: PyTorch's fused CPU op a segment at a time (no dropout); else SDPA with autograd."""
    b, h, n, d = q.shape
    nb = layout.blocks.shape[0]
    if nb == 1 and layout.block > n:  # one block: its padding would cost block^2 scores
        layout = dataclasses.replace(layout, block=n)
    c = layout.block
    pad = nb * c - n
    real = real_positions(n, nb * c, key_padding_mask, q.device)  # (b | 1, npad)
    if fused:
        padded = [(F.pad(t, (0, 0, 0, pad)) if pad else t).contiguous() for t in (q, k, v)]
        geo = _Blocks(layout, mod, real, (b, h, nb * c, d))
        return BlockSparseFlash.apply(*padded, geo, scale, global_rows)[:, :, :n]
    out = _gathered_sdpa(q, k, v, layout, mod, real, scale, dropout)
    if not global_rows:
        return out
    keys = torch.arange(n, device=q.device)
    ok = mod(keys[:global_rows, None], keys[None, :]) & real[..., None, :n]  # (b|1, g, n)
    rows = F.scaled_dot_product_attention(
        q[:, :, :global_rows],
        k,
        v,
        attn_mask=additive_mask(ok, q.dtype).unsqueeze(-3),
        dropout_p=dropout,
        scale=scale,
    )
    return torch.cat([rows, out[:, :, global_rows:]], dim=2)


def _gathered_sdpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    layout: BlockLayout,
    mod: MaskMod,
    real: Tensor,
    scale: float,
    dropout: float,
) -> Tensor:
    """Every query block at once through SDPA with autograd: the path with dropout, off CPU."""
    b, h, n, d = q.shape
    c = layout.block
    nb, slots = layout.blocks.shape
    pad = nb * c - n

    def blocks_of(x: Tensor) -> Tensor:  # (b, h, n, d) -> (b, h, nb, c, d)
        return (F.pad(x, (0, 0, 0, pad)) if pad else x).reshape(b, h, nb, c, d)

    qb = blocks_of(q).transpose(1, 2).reshape(b * nb, h, c, d)
    # (b, h, nb, K, c, d) -> (b * nb, h, K * c, d): each query block's keys, one copy
    kb, vb = (blocks_of(t)[:, :, layout.blocks].transpose(1, 2) for t in (k, v))
    kb, vb = (t.reshape(b * nb, h, slots * c, d) for t in (kb, vb))
    mask = _Blocks(layout, mod, real, (b, h, nb * c, d)).mask(0, nb, q.dtype)
    out = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, dropout_p=dropout, scale=scale)
    return out.view(b, nb, h, c, d).transpose(1, 2).reshape(b, h, nb * c, d)[:, :, :n]
