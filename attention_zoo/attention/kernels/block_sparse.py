"""Block-sparse softmax attention: every query block attends to a static number of gathered key
blocks, masked within them by the pattern's mask_mod (BigBird; sliding window with global tokens).

Query block i gathers the key blocks `layout.blocks[i]` (the same count K for every block, unused
slots masked), so scores are (blocks, block, K * block): memory linear in n. The token mask comes
from the pattern's mask_mod, the function the dense `pattern(n)` also reads, so kernel and pattern
agree by construction. Query rows that see every key (global tokens) are attended densely:
(rows, n) scores, still linear in n. Computed by SDPA (fused kernels and their backward).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..base import MaskMod, mask_value


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


def _additive(ok: Tensor, dtype: torch.dtype) -> Tensor:
    zero = torch.zeros((), dtype=dtype, device=ok.device)
    return torch.where(ok, zero, torch.full((), mask_value(dtype), dtype=dtype, device=ok.device))


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
) -> Tensor:
    """(b, h, n, d) x3 -> (b, h, n, d): softmax over the keys `mod` allows, gathered by `layout`
    (which must cover them) for rows >= global_rows, over all n keys for the first global_rows."""
    b, h, n, d = q.shape
    c = layout.block
    nb, slots = layout.blocks.shape
    pad = nb * c - n
    real = torch.arange(nb * c, device=q.device) < n  # (npad,)
    if key_padding_mask is not None:
        real = real & F.pad(key_padding_mask, (0, pad), value=False)  # (b, npad)

    def blocks_of(x: Tensor) -> Tensor:  # (b, h, n, d) -> (b, h, nb, c, d)
        return (F.pad(x, (0, 0, 0, pad)) if pad else x).reshape(b, h, nb, c, d)

    qb = blocks_of(q).transpose(1, 2).reshape(b * nb, h, c, d)
    # (b, h, nb, K, c, d) -> (b * nb, h, K * c, d): each query block's keys, one copy
    kb, vb = (blocks_of(t)[:, :, layout.blocks].transpose(1, 2) for t in (k, v))
    kb, vb = (t.reshape(b * nb, h, slots * c, d) for t in (kb, vb))
    kpos = (layout.blocks[:, :, None] * c + torch.arange(c, device=q.device)).view(nb, 1, -1)
    qpos = torch.arange(nb * c, device=q.device).view(nb, c, 1)
    ok = mod(qpos, kpos) & layout.used.repeat_interleave(c, dim=1)[:, None, :]
    ok = ok & real[..., kpos]  # padding keys: (nb, c, K c) or (b, nb, c, K c)
    ok = ok.expand(b, nb, c, slots * c).reshape(b * nb, 1, c, slots * c)
    out = F.scaled_dot_product_attention(
        qb, kb, vb, attn_mask=_additive(ok, q.dtype), dropout_p=dropout, scale=scale
    )
    out = out.view(b, nb, h, c, d).transpose(1, 2).reshape(b, h, nb * c, d)[:, :, :n]
    if not global_rows:
        return out
    keys = torch.arange(n, device=q.device)
    ok = mod(keys[:global_rows, None], keys[None, :]) & real[..., None, :n]  # (b|1, g, n)
    rows = F.scaled_dot_product_attention(
        q[:, :, :global_rows],
        k,
        v,
        attn_mask=_additive(ok, q.dtype).unsqueeze(-3),
        dropout_p=dropout,
        scale=scale,
    )
    return torch.cat([rows, out[:, :, global_rows:]], dim=2)
