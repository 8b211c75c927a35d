"""Chunked local attention (Reformer's LocalSelfAttention; Parmar et al. 2018, Kitaev et al. 2020).

The sequence is cut into chunks; each query attends to the keys of its own chunk plus
`num_chunks_before` previous and `num_chunks_after` following chunks (causally masked by position
when causal). Any length works: the sequence is padded to whole chunks and padding keys are masked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .base import AttentionCore, mask_value
from .kernels.chunked import check_chunking, math_attention, resolve_kernel
from .kernels.local_fused import LocalFlash, flat, local_masks, local_windows, unflat
from .spec import Capabilities, register_attention


@dataclass(frozen=True, kw_only=True)
class LocalConfig:
    """Options of chunked local attention."""

    chunk_length: int = 64  # positions per chunk
    num_chunks_before: int = 1  # previous chunks each query also sees
    num_chunks_after: int = 0  # following chunks each query also sees (ignored when causal)
    kernel: str = "auto"  # auto (flash on cpu/meta, else math), flash, math

    def __post_init__(self) -> None:
        check_chunking(
            "local", self.chunk_length, self.num_chunks_before, self.num_chunks_after, self.kernel
        )


@register_attention(
    "local",
    config=LocalConfig,
    caps=Capabilities(exact=False),
)
class LocalAttention(AttentionCore):
    """Chunked local attention: own chunk plus neighbour chunks; O(n * chunk) memory."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        b, h, n, d = q.shape
        cfg = self.cfg
        after = 0 if self.causal else cfg.num_chunks_after  # later chunks are all in the future
        win = local_windows(b, n, cfg.chunk_length, cfg.num_chunks_before, after)
        masks = local_masks(
            win,
            b,
            n,
            causal=self.causal,
            key_padding_mask=key_padding_mask,
            dtype=q.dtype,
            device=q.device,
        )
        scale = 1 / math.sqrt(d)
        if resolve_kernel(cfg.kernel, q.device, q.dtype) == "flash":
            return LocalFlash.apply(q, k, v, win, masks, scale, key_padding_mask is not None)
        npad = win.length // b
        q4 = win.to_blocks(flat(q, npad))
        pad = (0, 0, 0, 0, win.front, win.back)
        k_long = torch.nn.functional.pad(flat(k, npad), pad)
        v_long = torch.nn.functional.pad(flat(v, npad), pad)
        out4, lse = math_attention(q4, k_long, v_long, win, masks, scale)
        if key_padding_mask is not None:  # as the flash path: no real key to see -> zeros
            out4 = out4 * (lse > mask_value(q.dtype) / 2).unsqueeze(-1)
        return unflat(out4.transpose(1, 2).reshape(win.length, h, d), b, n)
