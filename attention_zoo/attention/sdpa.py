"""Full attention through torch.nn.functional.scaled_dot_product_attention (fused kernels)."""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..errors import OptionError
from .base import AttentionCore, check_dropout
from .decode import KVCache, kv_cache, kv_cache_bytes, kv_step, sdpa_attention
from .kernels.dense import allowed_mask
from .spec import Capabilities, register_attention

KERNELS = {
    "auto": None,
    "math": SDPBackend.MATH,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}


@dataclass(frozen=True, kw_only=True)
class SDPAConfig:
    """Options of the SDPA backend."""

    kernel: str = "auto"  # force one SDPA kernel: auto, math, flash, efficient, cudnn
    dropout: float = 0.0  # attention-probability dropout (SDPA's dropout_p), in training only

    def __post_init__(self) -> None:
        check_dropout("sdpa", self.dropout)
        if self.kernel not in KERNELS:
            raise OptionError(f"sdpa kernel {self.kernel!r} is not one of: {', '.join(KERNELS)}")


@register_attention("sdpa", config=SDPAConfig, caps=Capabilities())
class SDPAAttention(AttentionCore):
    """Full attention via F.scaled_dot_product_attention; PyTorch picks or is told the kernel."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        if key_padding_mask is None:
            return self._sdpa(q, k, v, mask=None, is_causal=self.causal)
        # SDPA takes either is_causal or a mask: fold causality into the mask.
        mask = allowed_mask(
            q.shape[-2], causal=self.causal, key_padding_mask=key_padding_mask, device=q.device
        )
        return self._sdpa(q, k, v, mask=mask, is_causal=False)

    def _sdpa(
        self, q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None, is_causal: bool
    ) -> Tensor:
        kernel = KERNELS[self.cfg.kernel]
        p = self.dropout_p
        if kernel is None:
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=p, is_causal=is_causal
            )
        with sdpa_kernel([kernel]):
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=p, is_causal=is_causal
            )

    # ---- decoding: a KV cache ----------------------------------------------------------------

    init_state = staticmethod(kv_cache)
    state_bytes = staticmethod(kv_cache_bytes)

    def step(
        self, q: Tensor, k: Tensor, v: Tensor, state: KVCache, key_padding_mask: Tensor | None
    ) -> tuple[Tensor, KVCache]:
        """New tokens against every cached key, through SDPA (see attention/decode.py); the
        prefill is the forward (is_causal: never a (t, n) mask)."""
        return kv_step(self, q, k, v, state, key_padding_mask, sdpa_attention)
