"""Chunked local attention (Reformer's LocalSelfAttention; Parmar et al. 2018, Kitaev et al. 2020).

The sequence is cut into chunks; each query attends to the keys of its own chunk plus
`num_chunks_before` previous and `num_chunks_after` following chunks (causally masked by position
when causal). Any length works: the sequence is padded to whole chunks and padding keys are masked.

`semantics="exact"` (default): neighbour chunks stop at the ends of the sequence, no following
chunks when causal, and a query that sees no real key outputs zeros.
`semantics="hf"`: transformers' LocalSelfAttention as it computes: neighbour chunks wrap around
the sequence (the first chunk's previous chunk is the last), following chunks are kept when causal
(wrapped ones then lie in the past), a query with no allowed key averages its window uniformly, and
a sequence no longer than one chunk gets full attention. Still exactly causal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .base import AttentionCore, check_dropout, check_semantics, pattern_kernels, semantics_caps
from .decode import (
    CACHED,
    CACHED_HF,
    DecodeState,
    KVCache,
    StateShape,
    WindowState,
    append,
    kv_cache,
    kv_cache_bytes,
    window_append,
    window_state,
    window_state_bytes,
    window_step,
)
from .dispatch import Call
from .inputs import check_kv_heads
from .kernels.chunked import math_attention, padded_length, padded_qkv
from .kernels.dense import dense_attention
from .kernels.flex import chunk_window_tiles
from .kernels.masks import MaskMod, mask_value, real_positions
from .kernels.patterns.local_fused import (
    LocalFlash,
    chunk_windows,
    flat,
    unflat,
)
from .kernels.rounds.circular import (
    CircularPlan,
    circular_math,
    consecutive_reason,
    empty_rows,
    window_means,
)
from .kernels.rounds.lsh_fused import RoundsFlash
from .options import check_chunking
from .spec import PATTERN, Capabilities, register_attention


@dataclass(frozen=True, kw_only=True)
class LocalConfig:
    """Options of chunked local attention."""

    chunk_length: int = 64  # positions per chunk
    num_chunks_before: int = 1  # previous chunks each query also sees
    num_chunks_after: int = 0  # following chunks each query also sees (exact: none when causal)
    semantics: str = "exact"  # exact, or hf (transformers' LocalSelfAttention, windows wrap)
    dropout: float = 0.0  # attention-probability dropout, in training mode only
    kernel: str = "auto"  # auto (the pick rule), cpu-fused, math, flex (exact semantics)
    kv_heads: int | None = None  # shared KV heads (GQA; 1: MQA); None: one per query head

    def __post_init__(self) -> None:
        check_kv_heads("local", self.kv_heads)
        check_chunking("local", self.chunk_length, self.num_chunks_before, self.num_chunks_after)
        check_semantics("local", self.semantics)
        check_dropout("local", self.dropout)
        KERNELS.check_option("local", self.kernel)

    def capabilities(self, caps: Capabilities) -> Capabilities:
        """HF semantics: wrapped windows may hold a key twice, so no (n, n) mask describes them."""
        return semantics_caps(caps, self.semantics, fixed_pattern=False)


@register_attention(
    "local", config=LocalConfig, caps=PATTERN, variants=({"kv_heads": 1}, {"semantics": "hf"})
)
class LocalAttention(AttentionCore):
    """Chunked local attention: own chunk plus neighbour chunks; O(n * chunk) memory."""

    cache_positions = True  # its KV-cache step reads positions from the cache

    def mask_mod(self, n: int, device: torch.device | str = "cpu") -> MaskMod | None:
        """Exact semantics: keys in the query's chunk, `before` chunks back and `after` ahead."""
        cfg = self.cfg
        if cfg.semantics != "exact":
            return None
        c, before, causal = cfg.chunk_length, cfg.num_chunks_before, self.causal
        after = 0 if causal else cfg.num_chunks_after

        def mod(i: Tensor, j: Tensor) -> Tensor:
            qc, kc = i // c, j // c
            seen = (kc >= qc - before) & (kc <= qc + after)
            return seen & (j <= i) if causal else seen

        return mod

    def key_tiles(self, n: int, device: torch.device) -> Tensor:
        """A query tile's keys: its chunks' windows."""
        cfg = self.cfg
        return chunk_window_tiles(
            n, cfg.chunk_length, cfg.num_chunks_before, cfg.num_chunks_after, self.causal, device
        )

    def _chunked(
        self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None, fused: bool
    ) -> Tensor:
        """The chunked kernels: PyTorch's fused CPU op (fused) or materialised blocks."""
        b, h, n, d = q.shape
        cfg = self.cfg
        dropout = self.dropout_p
        if cfg.semantics == "hf":
            if n <= cfg.chunk_length:  # HF: the sequence fits one chunk: full attention
                allowed = self.allowed(q, key_padding_mask)
                return dense_attention(q, k, v, allowed, scale=1 / math.sqrt(d), dropout=dropout)
            # causal with no following chunk, no padding and fewer previous chunks than the
            # sequence has: every wrapped key is in the future and none is there twice, so HF's
            # pattern is the exact one (whose fused kernel is lighter)
            chunks = padded_length(n, cfg.chunk_length) // cfg.chunk_length
            exact = self.causal and cfg.num_chunks_after == 0 and key_padding_mask is None
            if not (exact and cfg.num_chunks_before < chunks):
                return self._attend_wrapped(q, k, v, key_padding_mask, dropout, fused)
        after = 0 if self.causal else cfg.num_chunks_after  # later chunks are all in the future
        win, masks = chunk_windows(
            q, cfg.chunk_length, cfg.num_chunks_before, after, self.causal, key_padding_mask
        )
        scale = 1 / math.sqrt(d)
        if fused:
            return LocalFlash.apply(q, k, v, win, masks, scale, key_padding_mask is not None)
        npad = win.length // b
        q4 = win.to_blocks(flat(q, npad))
        pad = (0, 0, 0, 0, win.front, win.back)
        k_long = torch.nn.functional.pad(flat(k, npad), pad)
        v_long = torch.nn.functional.pad(flat(v, npad), pad)
        out4, lse = math_attention(q4, k_long, v_long, win, masks, scale, dropout)
        if key_padding_mask is not None:  # as the fused path: no real key to see -> zeros
            out4 = out4 * (lse > mask_value(q.dtype) / 2).unsqueeze(-1)
        return unflat(out4.transpose(1, 2).reshape(win.length, h, d), b, n)

    def _attend_wrapped(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        key_padding_mask: Tensor | None,
        dropout: float,
        fused: bool,
    ) -> Tensor:
        """HF semantics: windows wrapping around the sequence, as one round of circular chunks."""
        b, h, n, d = q.shape
        cfg = self.cfg
        npad = padded_length(n, cfg.chunk_length)
        q, k, v = padded_qkv(q, k, v, npad)
        real = real_positions(n, npad, key_padding_mask, q.device)
        plan = CircularPlan(
            chunk=cfg.chunk_length,
            before=cfg.num_chunks_before,
            after=cfg.num_chunks_after,
            causal=self.causal,
            groups=[(0, 1)],
            perm=torch.arange(npad, device=q.device).expand(b, h, 1, npad),
            key_real=real.expand(b, npad),
            scale=1 / math.sqrt(d),
            key_eps=None,
            self_partial=False,
        )
        if fused:  # consecutive windows (the pick rule checked)
            out = RoundsFlash.apply(q, None if k is q else k, v, plan)
            if key_padding_mask is not None:  # HF: a query with no allowed key averages its window
                out = torch.where(empty_rows(plan), window_means(v, plan), out)
        else:
            out = circular_math(q, k, v, plan, dropout=dropout)
        return out[:, :, :n]

    # ---- decoding: exact, a ring of the window; hf, a KV cache read as transformers does -----

    @staticmethod
    def decoding(cfg: LocalConfig) -> str:
        return CACHED_HF if cfg.semantics == "hf" else CACHED

    def window_size(self) -> int:
        """Earlier positions a query may see: the rest of its chunk and `before` chunks back."""
        c = self.cfg.chunk_length
        return self.cfg.num_chunks_before * c + c - 1

    def init_state(self, shape: StateShape) -> DecodeState:
        """Exact: a ring of window_size() positions (bounded); hf: every position, as HF caches
        every hidden state."""
        if self.cfg.semantics == "hf":
            return kv_cache(shape)
        return window_state(shape, size=self.window_size())

    def state_bytes(self, shape: StateShape) -> int:
        if self.cfg.semantics == "hf":
            return kv_cache_bytes(shape)
        return window_state_bytes(shape, size=self.window_size())

    def step(
        self, q: Tensor, k: Tensor, v: Tensor, state: DecodeState, key_padding_mask: Tensor | None
    ) -> tuple[Tensor, DecodeState]:
        """New tokens against the window (see attention/decode.py); the prefill is the forward."""
        scale = 1 / math.sqrt(q.shape[-1])
        if isinstance(state, WindowState):
            if state.length == 0:
                out = self.attend(q, k, v, key_padding_mask)
                return out, window_append(state, k, v, key_padding_mask)
            mod = self.mask_mod(state.length + q.shape[2], q.device)
            return window_step(q, k, v, state, key_padding_mask, mod, scale=scale)
        return self._step_hf(q, k, v, state, key_padding_mask, scale)

    def _step_hf(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        state: KVCache,
        key_padding_mask: Tensor | None,
        scale: float,
    ) -> tuple[Tensor, KVCache]:
        """HF's LocalSelfAttention with a cache: the token at p sees the cached states from
        ((p // chunk) - before) * chunk on, where a negative start counts from the end (its
        slice `past[start:]`), no mask; keys already padded stay masked here."""
        start, t = state.length, q.shape[2]
        state = append(state, k, v, key_padding_mask)
        if start == 0:
            return self.attend(q, k, v, key_padding_mask), state
        c, before = self.cfg.chunk_length, self.cfg.num_chunks_before
        p = state.new_positions(t)[:, None]
        first = (p // c - before) * c
        first = torch.where(first >= 0, first, (p + first).clamp(min=0))
        j = state.key_positions()[None, :]
        allowed = ((j >= first) & (j <= p))[None, None] & state.real_keys()[:, None, None, :]
        return dense_attention(q, state.keys(), state.values(), allowed, scale=scale), state


def _consecutive(core: LocalAttention, call: Call) -> str | None:
    return consecutive_reason(core.cfg, call.length)


KERNELS = pattern_kernels(
    LocalAttention._chunked,
    "PyTorch's fused CPU attention over chunk windows; backward from the log-sum-exp",
    "materialised chunk windows with autograd",
    (_consecutive,),
)
LocalAttention.kernels = KERNELS
