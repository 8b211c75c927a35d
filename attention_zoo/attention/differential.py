"""Differential attention (Ye et al. 2024, "Differential Transformer"): each head's q and k split in
halves, out = RMSNorm(softmax(q1 k1^T) v - lambda softmax(q2 k2^T) v) * (1 - lambda_init), the
difference cancelling the attention both maps give to irrelevant keys.

Kind "approximate": it replaces the softmax map rather than computing it, so its approx_error
against full attention is measured like the other replacements'. Values stay a head wide: the
plain input layout (q, k, v of one width) is the paper's (2 x its head size for all three).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import ShapeError
from .base import AttentionCore
from .decode import KVCache, kv_cache, kv_cache_bytes, kv_step, sdpa_attention
from .dispatch import Implementation, KernelTable, cpu_fused, materialised
from .inputs import check_kv_heads
from .kernels.dense import dense_attention
from .kernels.differential import NORM_EPS, fused_differential
from .options import check_int
from .spec import Capabilities, register_attention


def lambda_init(layer: int) -> float:
    """The paper's schedule over depth: 0.2 at the first layer, towards 0.8 in deep ones."""
    return 0.8 - 0.6 * math.exp(-0.3 * (layer - 1))


@dataclass(frozen=True, kw_only=True)
class DifferentialConfig:
    """Options of differential attention."""

    layer: int = 1  # the layer's depth, from 1: sets lambda_init (see `lambda_init`)
    lambda_dim: int = 32  # width of the learned vectors lambda is made of (the paper: a half head)
    kv_heads: int | None = None  # shared KV heads (GQA; 1: MQA); None: one per query head
    kernel: str = "auto"  # auto (the pick rule), cpu-fused, sdpa, math

    def __post_init__(self) -> None:
        check_int("layer", self.layer, minimum=1, backend="differential")
        check_int("lambda_dim", self.lambda_dim, minimum=1, backend="differential")
        check_kv_heads("differential", self.kv_heads)
        KERNELS.check_option("differential", self.kernel)


@register_attention(
    "differential",
    config=DifferentialConfig,
    caps=Capabilities(exact=False),
    variants=({"kv_heads": 1},),
)
class DifferentialAttention(AttentionCore):
    """The difference of two softmax maps with a learned lambda, then a per-head RMSNorm."""

    cache_positions = True  # its KV-cache step reads positions from the cache

    def __init__(self, cfg: DifferentialConfig, *, causal: bool = False) -> None:
        super().__init__(cfg, causal=causal)
        self.lambda_init = lambda_init(cfg.layer)
        # lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init, learned through the vectors
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
            nn.Parameter(torch.randn(cfg.lambda_dim) * 0.1) for _ in range(4)
        )

    def lam(self) -> Tensor:
        """lambda, a scalar."""
        first = torch.exp(torch.dot(self.lambda_q1, self.lambda_k1))
        return first - torch.exp(torch.dot(self.lambda_q2, self.lambda_k2)) + self.lambda_init

    def combine(self, first: Tensor, second: Tensor) -> Tensor:
        """The two maps' outputs (b, h, t, d) -> the heads' output: their difference, normalised
        per head and scaled by 1 - lambda_init."""
        lam = self.lam().to(first.dtype)
        diff = first - lam * second
        return F.rms_norm(diff, (diff.shape[-1],), eps=NORM_EPS) * (1 - self.lambda_init)

    def _sdpa(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        # keys with the other half zeroed: q . [k1, 0] = q1 . k1, so SDPA's fused kernels (one
        # width for q, k and v) compute each map, and q, v are read as given
        half = _half(q)
        mask = None
        if key_padding_mask is not None:  # SDPA takes is_causal or a mask: causality goes in it
            mask = self.allowed(q, key_padding_mask)
        first = torch.arange(q.shape[-1], device=q.device) < half

        def softmax(keys: Tensor) -> Tensor:
            return F.scaled_dot_product_attention(
                q,
                keys,
                v,
                attn_mask=mask,
                is_causal=self.causal and mask is None,
                scale=half**-0.5,
                enable_gqa=k.shape[1] != q.shape[1],
            )

        return self.combine(softmax(k * first), softmax(k * ~first))

    def _fused(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        _half(q)
        lam = self.lam()
        return fused_differential(
            q, k, v, lam, key_padding_mask, causal=self.causal, out_scale=1 - self.lambda_init
        )

    def _math(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        half = _half(q)
        allowed = self.allowed(q, key_padding_mask)
        (q1, q2), (k1, k2) = q.split(half, -1), k.split(half, -1)
        first = dense_attention(q1, k1, v, allowed, scale=half**-0.5)
        return self.combine(first, dense_attention(q2, k2, v, allowed, scale=half**-0.5))

    # ---- decoding: a KV cache ----------------------------------------------------------------

    init_state = staticmethod(kv_cache)
    state_bytes = staticmethod(kv_cache_bytes)

    def step(
        self, q: Tensor, k: Tensor, v: Tensor, state: KVCache, key_padding_mask: Tensor | None
    ) -> tuple[Tensor, KVCache]:
        """New tokens against every cached key, both maps (see attention/decode.py)."""

        def attend(q: Tensor, keys: Tensor, values: Tensor, allowed: Tensor | None) -> Tensor:
            half = _half(q)
            (q1, q2), (k1, k2) = q.split(half, -1), keys.split(half, -1)
            first = sdpa_attention(q1, k1, values, allowed, scale=half**-0.5)
            return self.combine(first, sdpa_attention(q2, k2, values, allowed, scale=half**-0.5))

        return kv_step(self, q, k, v, state, key_padding_mask, attend)


def _half(q: Tensor) -> int:
    """Half of q's head size; raises ShapeError unless it is even."""
    d = q.shape[-1]
    if d % 2:
        raise ShapeError(
            f"differential attention splits each head's q and k in halves: head_dim must be "
            f"even, got {d}"
        )
    return d // 2


KERNELS = KernelTable(
    (
        cpu_fused(
            DifferentialAttention._fused,
            "both maps, the difference and the norm in one autograd Function on the fused CPU "
            "kernel (saves the outputs and log-sum-exps only)",
            grouped=True,
        ),
        Implementation(
            name="sdpa",
            summary="two calls of PyTorch's SDPA, one per map (fused kernels, keys half zeroed)",
            run=DifferentialAttention._sdpa,
            grouped=True,
        ),
        materialised(DifferentialAttention._math, "two materialised softmax maps", grouped=True),
    ),
    {
        "cpu": ("cpu-fused", "sdpa", "math"),
        "cuda": ("sdpa", "math"),
    },
)
DifferentialAttention.kernels = KERNELS
