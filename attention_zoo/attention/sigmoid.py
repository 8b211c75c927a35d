"""Sigmoid attention (Ramapuram et al. 2024, "Theory, Analysis, and Best Practices for Sigmoid
Self-Attention"): out = sigmoid(q k^T / sqrt(d) + b) v, each weight on its own, no softmax.

Kind "approximate": it is not softmax attention, has no fixed pattern and no recurrence, so its
approx_error against full attention is measured like the other replacements'.
Bias b = -log(n) as the paper, n counted per query: the keys it may see (causal: real keys up to
itself), so padding changes nothing and decoding equals the causal forward.
FlexAttention could give it on CUDA (a logsigmoid score_mod, the output times exp(lse)); the tiled
kernel runs everywhere instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..errors import OptionError
from .base import AttentionCore
from .decode import KVCache, kv_cache, kv_cache_bytes, kv_step
from .dispatch import Implementation, KernelTable, materialised
from .inputs import check_kv_heads
from .kernels.sigmoid import key_counts, paper_bias, sigmoid_reference, tiled_sigmoid
from .kernels.sums.plain import compute_dtype
from .spec import Capabilities, register_attention


@dataclass(frozen=True, kw_only=True)
class SigmoidConfig:
    """Options of sigmoid attention."""

    bias: float | None = None  # added to every score; None: -log(n), n the keys a query may see
    kv_heads: int | None = None  # shared KV heads (GQA; 1: MQA); None: one per query head
    kernel: str = "auto"  # auto (the pick rule), tiled, math

    def __post_init__(self) -> None:
        b = self.bias
        if b is not None and (isinstance(b, bool) or not isinstance(b, (int, float))):
            raise OptionError(f"sigmoid option bias must be a float or None (-log n), got {b!r}")
        check_kv_heads("sigmoid", self.kv_heads)
        KERNELS.check_option("sigmoid", self.kernel)


@register_attention(
    "sigmoid", config=SigmoidConfig, caps=Capabilities(exact=False), variants=({"kv_heads": 1},)
)
class SigmoidAttention(AttentionCore):
    """Sigmoid attention, bias -log(n): tiles of keys summed without the n x n map."""

    cache_positions = True  # its KV-cache step reads positions from the cache

    def bias_for(self, counts: Tensor, dtype: torch.dtype) -> Tensor:
        """(b | 1, t) bias of queries that may see `counts` keys each."""
        if self.cfg.bias is None:
            return paper_bias(counts, dtype)
        return counts.new_full(counts.shape, self.cfg.bias, dtype=dtype)

    def _math(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        n = q.shape[-2]
        allowed = self.allowed(q, key_padding_mask)
        counts = key_counts(key_padding_mask, n, causal=self.causal, device=q.device)
        bias = self.bias_for(counts, q.dtype)[:, None]
        return sigmoid_reference(q, k, v, allowed, bias, scale=1 / math.sqrt(q.shape[-1]))

    def _tiled(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        n = q.shape[-2]
        counts = key_counts(key_padding_mask, n, causal=self.causal, device=q.device)
        return tiled_sigmoid(
            q,
            k,
            v,
            key_padding_mask,
            self.bias_for(counts, compute_dtype(q.dtype)),
            scale=1 / math.sqrt(q.shape[-1]),
            causal=self.causal,
        )

    # ---- decoding: a KV cache ----------------------------------------------------------------

    init_state = staticmethod(kv_cache)
    state_bytes = staticmethod(kv_cache_bytes)

    def step(
        self, q: Tensor, k: Tensor, v: Tensor, state: KVCache, key_padding_mask: Tensor | None
    ) -> tuple[Tensor, KVCache]:
        """New tokens against every cached key (see attention/decode.py): each sees the keys its
        allowed mask holds, so its bias counts them."""

        def attend(q: Tensor, keys: Tensor, values: Tensor, allowed: Tensor | None) -> Tensor:
            counts = keys.new_full((1, q.shape[2]), keys.shape[2], dtype=torch.int64)
            if allowed is not None:
                counts = allowed.sum(-1)[:, 0]  # (b | 1, t): the same for every head
            bias = self.bias_for(counts, q.dtype)[:, None]
            return sigmoid_reference(q, keys, values, allowed, bias, scale=q.shape[-1] ** -0.5)

        return kv_step(self, q, k, v, state, key_padding_mask, attend)


KERNELS = KernelTable(
    (
        Implementation(
            name="tiled",
            summary="(query chunk x key block) tiles summed, no n x n map; backward recomputes",
            run=SigmoidAttention._tiled,
            grouped=True,
        ),
        materialised(
            SigmoidAttention._math, "materialised n x n weights with autograd", grouped=True
        ),
    ),
    {device: ("tiled", "math") for device in ("cpu", "cuda")},
)
SigmoidAttention.kernels = KERNELS
