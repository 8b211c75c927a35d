"""BigBird block-sparse attention (Zaheer et al. 2020): window, global and random key blocks.

The sequence is cut into blocks of `block_size`. Query block i sees the `num_window_blocks` blocks
around it (i - w // 2 ... ), the first `num_global_blocks` blocks (global: they also see every
key) and `num_random_blocks` other blocks drawn per query block, fixed by `seed`. Causal: only
blocks at or before the query block (the window is the block and the w - 1 before it; random
blocks come from before the window), causal inside the query's own block. Exact: a softmax under
that mask (`pattern(n)`); computed on gathered key blocks, memory linear in n.

Seeded random blocks are an integer hash of (seed, query block, slot): the same on every device,
under torch.compile, at every call. Causal, a query block's random blocks do not depend on the
length; bidirectional, its candidates include the blocks after its window, so they do: padding a
batch to another length can change the random blocks of its real tokens.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import Tensor

from ..errors import OptionError
from .base import AttentionCore, check_dropout, pattern_kernels
from .decode import KVCache, StateShape, append, kv_cache, kv_cache_bytes
from .inputs import check_kv_heads
from .kernels.chunked import padded_length
from .kernels.dense import dense_attention
from .kernels.masks import MaskMod
from .kernels.patterns.block_sparse import BlockLayout, block_sparse_attention
from .options import check_int
from .spec import PATTERN, Capabilities, register_attention


@dataclass(frozen=True, kw_only=True)
class BigBirdConfig:
    """Options of BigBird attention."""

    block_size: int = 64  # positions per block
    num_window_blocks: int = 3  # blocks around each query block (causal: it and those before)
    num_global_blocks: int = 2  # the first blocks: they see every key, every query sees them
    num_random_blocks: int = 3  # other blocks each query block sees, drawn per query block
    seed: int | None = 0  # fixes the random blocks; None draws them from torch's global RNG
    dropout: float = 0.0  # attention-probability dropout, in training mode only
    kernel: str = "auto"  # auto (the pick rule), cpu-fused, math, flex
    kv_heads: int | None = None  # shared KV heads (GQA; 1: MQA); None: one per query head

    def __post_init__(self) -> None:
        check_kv_heads("bigbird", self.kv_heads)
        for name, least in (
            ("block_size", 1),
            ("num_window_blocks", 1),
            ("num_global_blocks", 0),
            ("num_random_blocks", 0),
        ):
            check_int(name, getattr(self, name), minimum=least, backend="bigbird")
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0
        ):
            raise OptionError(f"bigbird option seed must be an int >= 0 or None, got {self.seed!r}")
        check_dropout("bigbird", self.dropout)
        KERNELS.check_option("bigbird", self.kernel)

    def capabilities(self, caps: Capabilities) -> Capabilities:
        """Unseeded: random blocks drawn anew every call, so no fixed pattern."""
        if self.seed is None:
            return dataclasses.replace(caps, deterministic=False, fixed_pattern=False)
        return caps


@register_attention("bigbird", config=BigBirdConfig, caps=PATTERN, variants=({"kv_heads": 1},))
class BigBirdAttention(AttentionCore):
    """BigBird block-sparse attention: window, global and random blocks; O(n) memory."""

    def window_start(self, i: Tensor) -> Tensor:
        """First window block of query blocks i (it may lie before block 0)."""
        w = self.cfg.num_window_blocks
        return i - (w - 1 if self.causal else w // 2)

    def random_blocks(self, nb: int, device: torch.device | str) -> Tensor:
        """(nb, r) long: the random key blocks of every query block, -1 where too few exist.

        Candidates are the blocks neither global nor in the window (causal: before the window).
        r distinct ones from m candidates: r draws x in [0, m - r] (a hash of the seed, the query
        block and the slot, mod m - r + 1), sorted, plus 0..r-1."""
        cfg, device = self.cfg, torch.device(device)
        r, g = cfg.num_random_blocks, cfg.num_global_blocks
        i = torch.arange(nb, device=device)
        if cfg.seed is None:
            h = torch.randint(0, 1 << 31, (nb, r), device=device)
        else:
            key = _hash32(_fold32(cfg.seed))
            h = _hash32(_hash32(key ^ i[:, None]) ^ torch.arange(r, device=device))
        lo = self.window_start(i)
        first = (lo - g).clamp(min=0)  # candidates g .. lo - 1
        after = (lo + cfg.num_window_blocks).clamp(min=g)
        second = (nb - after).clamp(min=0)  # candidates after .. nb - 1 (none when causal)
        if self.causal:
            second = torch.zeros_like(second)
        m = (first + second)[:, None]
        x = torch.remainder(h, (m - r + 1).clamp(min=1)).sort(dim=1).values
        y = x + torch.arange(r, device=device)
        block = torch.where(y < first[:, None], g + y, after[:, None] + y - first[:, None])
        return torch.where(y < m, block, -1)

    def mask_mod(self, n: int, device: torch.device | str = "cpu") -> MaskMod:
        size = self.cfg.block_size
        return self.pattern_with(self.random_blocks(padded_length(n, size) // size, device))

    def pattern_with(self, table: Tensor) -> MaskMod:
        """The pattern as a mask_mod, given the random blocks (nb, r) of one draw: a lookup in the
        (nb, nb) table of which key blocks each query block sees (pointwise, as FlexAttention
        needs), causal inside the query's own block."""
        cfg, causal = self.cfg, self.causal
        size, g, w = cfg.block_size, cfg.num_global_blocks, cfg.num_window_blocks
        nb = table.shape[0]
        qb, kb = (
            torch.arange(nb, device=table.device)[:, None],
            torch.arange(nb, device=table.device),
        )
        lo = self.window_start(qb)
        seen = ((kb >= lo) & (kb < lo + w)) | (qb < g) | (kb < g)
        picked = torch.zeros(nb, nb + 1, dtype=torch.bool, device=table.device)
        picked.scatter_(1, torch.where(table >= 0, table, nb), True)  # -1: the spare column
        seen = seen | picked[:, :nb]
        last = nb - 1

        def mod(i: Tensor, j: Tensor) -> Tensor:
            ok = seen[(i // size).clamp(max=last), (j // size).clamp(max=last)]
            return ok & (j <= i) if causal else ok

        return mod

    def _blocks(
        self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None, fused: bool
    ) -> Tensor:
        """Gathered key blocks: PyTorch's fused CPU op a segment at a time (fused), or SDPA."""
        cfg, n = self.cfg, q.shape[-2]
        nb = padded_length(n, cfg.block_size) // cfg.block_size
        i = torch.arange(nb, device=q.device)[:, None]
        table = self.random_blocks(nb, q.device)
        heads = torch.arange(cfg.num_global_blocks, device=q.device).expand(nb, -1)
        near = self.window_start(i) + torch.arange(cfg.num_window_blocks, device=q.device)
        blocks = torch.cat([heads, near, table], dim=1)
        layout = BlockLayout.of(cfg.block_size, blocks, blocks >= 0)
        return block_sparse_attention(
            q,
            k,
            v,
            layout,
            self.pattern_with(table),
            global_rows=min(cfg.num_global_blocks * cfg.block_size, n),
            key_padding_mask=key_padding_mask,
            scale=1 / math.sqrt(q.shape[-1]),
            dropout=self.dropout_p,
            fused=fused,
        )

    # ---- decoding: a KV cache (random blocks reach anywhere back), a fixed number of blocks read

    def init_state(self, shape: StateShape) -> BigBirdState:
        """Every position's keys and values (a later block's random blocks may be any earlier
        one) and the random blocks of every block up to max_length: causal, they do not depend
        on the length; unseeded, this one draw serves the whole generation."""
        table = self.random_blocks(self.blocks_for(shape.max_length), shape.device)
        return kv_cache(shape, BigBirdState, table=table)

    def state_bytes(self, shape: StateShape) -> int:
        table = self.blocks_for(shape.max_length) * self.cfg.num_random_blocks * 8
        return kv_cache_bytes(shape) + table

    def blocks_for(self, n: int) -> int:
        """Blocks covering n positions."""
        return padded_length(n, self.cfg.block_size) // self.cfg.block_size

    def step(
        self, q: Tensor, k: Tensor, v: Tensor, state: BigBirdState, key_padding_mask: Tensor | None
    ) -> tuple[Tensor, BigBirdState]:
        """Each new token reads its block's global, window and random blocks from the cache: the
        same number of keys at any length (see attention/decode.py)."""
        start, t = state.length, q.shape[2]
        state = append(state, k, v, key_padding_mask)
        if start == 0:
            return self.attend(q, k, v, key_padding_mask), state
        cfg, device = self.cfg, q.device
        size = cfg.block_size
        p = torch.arange(start, start + t, device=device)  # (t,)
        qb = p // size
        near = self.window_start(qb)[:, None] + torch.arange(cfg.num_window_blocks, device=device)
        heads = torch.arange(cfg.num_global_blocks, device=device).expand(t, -1)
        blocks = torch.cat([heads, near, state.table[qb]], dim=1)  # (t, K)
        slots = blocks.shape[1]
        earlier = torch.ones(slots, slots, dtype=torch.bool, device=device).tril(-1)
        repeat = ((blocks[:, :, None] == blocks[:, None, :]) & earlier).any(-1)
        used = (blocks >= 0) & (blocks <= qb[:, None]) & ~repeat
        j = (blocks[:, :, None] * size + torch.arange(size, device=device)).flatten(1)  # (t, K c)
        used = used.repeat_interleave(size, dim=1)
        used = used & (j <= p[:, None])
        j = j.clamp(0, state.length - 1)  # unused slots read a real position, masked
        allowed = used & self.pattern_with(state.table)(p[:, None], j)
        real = state.real[:, j]  # (b, t, K c)
        allowed = allowed[None, None] & real[:, None]
        keys, values = state.k[:, :, j], state.v[:, :, j]  # (b, h, t, K c, d)
        scale = 1 / math.sqrt(q.shape[-1])
        out = dense_attention(q.unsqueeze(3), keys, values, allowed.unsqueeze(3), scale=scale)
        return out.squeeze(3), state


@dataclass(frozen=True, kw_only=True)
class BigBirdState(KVCache):
    """A KV cache and the random key blocks of every query block (nb, r) long."""

    table: Tensor


_MASK32 = (1 << 32) - 1
_Int = TypeVar("_Int", Tensor, int)


def _fold32(seed: int) -> int:
    """A seed of any size as 32 bits (its high bits folded in)."""
    folded = 0
    while True:
        folded ^= seed & _MASK32
        seed >>= 32
        if not seed:
            return folded


def _hash32(x: _Int) -> _Int:
    """An integer hash of 32-bit values (ints, or int64 tensors in [0, 2^32)) to 32 bits: every
    product stays below 2^63, so it is exact in int64 on any device and under torch.compile."""
    for shift, factor in ((16, 0x7FEB352D), (15, 0x2C1B3C6D)):
        x = ((x ^ (x >> shift)) * factor) & _MASK32
    return x ^ (x >> 16)


KERNELS = pattern_kernels(
    BigBirdAttention._blocks,
    "gathered key blocks through PyTorch's fused CPU attention, a segment at a time",
    "gathered key blocks through SDPA with autograd; global rows dense",
)
BigBirdAttention.kernels = KERNELS
