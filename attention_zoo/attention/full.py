"""Full softmax attention materialising the n x n scores: the reference (Vaswani et al. 2017)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from torch import Tensor

from .base import AttentionCore, check_dropout
from .decode import KVCache, kv_cache, kv_cache_bytes, kv_step
from .dispatch import KernelTable, materialised
from .inputs import check_kv_heads
from .kernels.dense import dense_attention
from .spec import Capabilities, register_attention


@dataclass(frozen=True, kw_only=True)
class FullConfig:
    """Options of full attention."""

    dropout: float = 0.0  # attention-probability dropout, in training mode only
    kernel: str = "auto"  # auto or math: one implementation, the dense reference
    kv_heads: int | None = None  # shared KV heads (GQA; 1: MQA); None: one per query head

    def __post_init__(self) -> None:
        check_dropout("full", self.dropout)
        check_kv_heads("full", self.kv_heads)
        KERNELS.check_option("full", self.kernel)


@register_attention("full", config=FullConfig, caps=Capabilities(), variants=({"kv_heads": 1},))
class FullAttention(AttentionCore):
    """Naive materialised softmax attention; O(n^2) memory. The reference for exact backends."""

    cache_positions = True  # its KV-cache step reads positions from the cache

    def _dense(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        allowed = self.allowed(q, key_padding_mask)
        return dense_attention(
            q, k, v, allowed, scale=1 / math.sqrt(q.shape[-1]), dropout=self.dropout_p
        )

    # ---- decoding: a KV cache ----------------------------------------------------------------

    init_state = staticmethod(kv_cache)
    state_bytes = staticmethod(kv_cache_bytes)

    def step(
        self, q: Tensor, k: Tensor, v: Tensor, state: KVCache, key_padding_mask: Tensor | None
    ) -> tuple[Tensor, KVCache]:
        """New tokens against every cached key (see attention/decode.py)."""
        attend = functools.partial(dense_attention, scale=q.shape[-1] ** -0.5)
        return kv_step(self, q, k, v, state, key_padding_mask, attend)


KERNELS = KernelTable(
    (materialised(FullAttention._dense, "materialised n x n scores with autograd", grouped=True),),
    {"cpu": ("math",), "cuda": ("math",)},
)
FullAttention.kernels = KERNELS
