"""Sliding-window attention with optional global tokens (Beltagy, Peters, Cohan 2020: Longformer).

Causal: query i sees keys j with i - window < j <= i; bidirectional: |i - j| < window. The first
`global_tokens` positions see every (causally allowed) key, and every query sees them. Exact: a
softmax under that mask (`pattern(n)`). Without global tokens, the band runs through local's fused
chunked kernels (chunks that see their neighbours, masked to the band; memory O(n * window)); with
them, or with dropout, through gathered key blocks (see `kernels/patterns/block_sparse`); on CUDA
through FlexAttention under the same mask_mod.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .base import AttentionCore, check_dropout, pattern_kernels
from .decode import (
    StateShape,
    WindowState,
    window_append,
    window_state,
    window_state_bytes,
    window_step,
)
from .inputs import check_kv_heads
from .kernels.chunked import padded_length
from .kernels.flex import TILE, tiles
from .kernels.masks import MaskMod
from .kernels.patterns.block_sparse import BlockLayout, block_sparse_attention
from .kernels.patterns.local_fused import LocalFlash, chunk_windows
from .options import check_int
from .spec import PATTERN, register_attention

# Largest chunk of the band kernels: a window of w keys costs chunks of min(w, this) queries that
# see ceil((w - 1) / chunk) chunks back, so smaller chunks waste fewer masked scores per query.
MAX_CHUNK = 64  # the fastest of 32, 64, 128 and 256, timed forward and backward


@dataclass(frozen=True, kw_only=True)
class SlidingWindowConfig:
    """Options of sliding-window attention."""

    window: int = 256  # causal: the query and window - 1 keys back; else |i - j| < window
    global_tokens: int = 0  # the first positions: they see all keys, all queries see them
    dropout: float = 0.0  # attention-probability dropout, in training mode only
    kernel: str = "auto"  # auto (the pick rule), cpu-fused, math, flex
    kv_heads: int | None = None  # shared KV heads (GQA; 1: MQA); None: one per query head

    def __post_init__(self) -> None:
        check_kv_heads("sliding-window", self.kv_heads)
        check_int("window", self.window, minimum=1, backend="sliding-window")
        check_int("global_tokens", self.global_tokens, minimum=0, backend="sliding-window")
        check_dropout("sliding-window", self.dropout)
        KERNELS.check_option("sliding-window", self.kernel)


def sliding_window_mod(window: int, global_tokens: int, causal: bool) -> MaskMod:
    """The sliding-window (+ global tokens) pattern as a mask_mod."""

    def mod(i: Tensor, j: Tensor) -> Tensor:
        seen = (j > i - window) & (j < i + window)
        if global_tokens:
            seen = seen | (i < global_tokens) | (j < global_tokens)
        return seen & (j <= i) if causal else seen

    return mod


@register_attention(
    "sliding-window",
    config=SlidingWindowConfig,
    caps=PATTERN,
    variants=({"kv_heads": 1}, {"global_tokens": 3}),
)
class SlidingWindowAttention(AttentionCore):
    """Sliding-window attention (+ global tokens); O(n * window) memory, exactly causal."""

    def mask_mod(self, n: int, device: torch.device | str = "cpu") -> MaskMod:
        return sliding_window_mod(self.cfg.window, self.cfg.global_tokens, self.causal)

    def geometry(self, n: int) -> tuple[int, int, int]:
        """(chunk, chunks seen before, chunks seen after) covering the band at length n."""
        chunk = min(self.cfg.window, MAX_CHUNK)
        chunks = padded_length(n, chunk) // chunk
        before = min(math.ceil((self.cfg.window - 1) / chunk), chunks - 1)
        return chunk, before, 0 if self.causal else before

    def key_tiles(self, n: int, device: torch.device) -> Tensor | None:
        """The band's tiles (and the global keys' first tiles); None with global tokens: their
        query tiles see every tile."""
        window, glob = self.cfg.window, self.cfg.global_tokens
        if glob:
            return None
        nq = tiles(n)
        i = torch.arange(nq, device=device)
        first = (i * TILE - (window - 1)).clamp(min=0) // TILE
        last = i if self.causal else (((i + 1) * TILE - 1 + window - 1) // TILE).clamp(max=nq - 1)
        width = 2 * ((window - 1) // TILE + 2) + 1  # bounds last - first + 1
        slots = first[:, None] + torch.arange(width, device=device)
        return torch.where(slots <= last[:, None], slots, -1)

    def _blocks(
        self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None, fused: bool
    ) -> Tensor:
        """The band through local's fused chunk windows (fused, no global tokens), else
        gathered key blocks (fused: a segment at a time; else SDPA with autograd)."""
        n, d = q.shape[2:]
        chunk, before, after = self.geometry(n)
        mod, scale, dropout = self.mask_mod(n, q.device), 1 / math.sqrt(d), self.dropout_p
        glob = self.cfg.global_tokens
        if not glob and fused:
            win, masks = chunk_windows(q, chunk, before, after, self.causal, key_padding_mask)
            # the band within every chunk's window: queries at front + t, keys at w
            t = torch.arange(chunk, device=q.device)[:, None] + win.front
            band = mod(t, torch.arange(win.width, device=q.device)[None, :])
            masks = dataclasses.replace(masks, allowed=masks.allowed & band)
            return LocalFlash.apply(q, k, v, win, masks, scale, key_padding_mask is not None)
        nb = padded_length(n, chunk) // chunk
        i = torch.arange(nb, device=q.device)[:, None]
        heads = torch.arange(-(-glob // chunk), device=q.device).expand(nb, -1)  # global blocks
        near = i + torch.arange(-before, after + 1, device=q.device)
        blocks = torch.cat([heads, near], dim=1)
        layout = BlockLayout.of(chunk, blocks, torch.ones_like(blocks, dtype=torch.bool))
        return block_sparse_attention(
            q,
            k,
            v,
            layout,
            mod,
            global_rows=min(glob, n),
            key_padding_mask=key_padding_mask,
            scale=scale,
            dropout=dropout,
            fused=fused,
        )

    # ---- decoding: the global tokens and a ring of window - 1 positions ----------------------

    def init_state(self, shape: StateShape) -> WindowState:
        """The first global_tokens positions and the window - 1 latest: bounded."""
        return window_state(shape, size=self.cfg.window - 1, front=self.cfg.global_tokens)

    def state_bytes(self, shape: StateShape) -> int:
        return window_state_bytes(shape, size=self.cfg.window - 1, front=self.cfg.global_tokens)

    def step(
        self, q: Tensor, k: Tensor, v: Tensor, state: WindowState, key_padding_mask: Tensor | None
    ) -> tuple[Tensor, WindowState]:
        """New tokens against the window (see attention/decode.py); the prefill is the forward."""
        if state.length == 0:
            out = self.attend(q, k, v, key_padding_mask)
            return out, window_append(state, k, v, key_padding_mask)
        mod = self.mask_mod(state.length + q.shape[2], q.device)
        scale = 1 / math.sqrt(q.shape[-1])
        return window_step(q, k, v, state, key_padding_mask, mod, scale=scale)


KERNELS = pattern_kernels(
    SlidingWindowAttention._blocks,
    "PyTorch's fused CPU attention: local's chunk windows masked to the band, or "
    "gathered key blocks a segment at a time (global tokens)",
    "gathered key blocks through SDPA with autograd; global rows dense",
)
SlidingWindowAttention.kernels = KERNELS
