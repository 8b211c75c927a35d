"""The attention sublayer: projections from (b, n, hidden) into any registered core and back."""

from __future__ import annotations

from typing import Any

import torch
from einops import rearrange
from torch import Tensor, nn
from torch.nn import functional as F

from ..attention import decode
from ..attention.base import BlockWeights, check_key_padding_mask
from ..attention.spec import build_attention, get_backend
from ..declarative import field_names
from ..errors import ConfigError, ShapeError


class SelfAttention(nn.Module):
    """Multi-head self-attention around a registered core.

    A core that needs shared QK gets one query/key projection and the same tensor as q and k.
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        backend: str = "full",
        *,
        head_size: int | None = None,
        causal: bool = False,
        device: str | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        if head_size is None:
            if hidden_size % num_heads:
                raise ConfigError(
                    f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}; "
                    f"pick num_heads among the divisors of {hidden_size} "
                    f"(e.g. {_divisors(hidden_size)}) or give head_size explicitly"
                )
            head_size = hidden_size // num_heads
        if num_heads < 1 or head_size < 1:
            raise ConfigError(
                f"num_heads and head_size must be >= 1, got {num_heads} and {head_size}"
            )
        self.spec = get_backend(backend)
        self.hidden_size, self.num_heads, self.head_size = hidden_size, num_heads, head_size
        self.shared_qk = self.spec.caps.shared_qk
        inner = num_heads * head_size
        # One fused input projection: [q, k, v] or, under shared QK, [qk, v].
        self.in_proj = nn.Linear(hidden_size, (2 if self.shared_qk else 3) * inner, bias=False)
        self.out_proj = nn.Linear(inner, hidden_size, bias=False)
        self.core = self.make_core(backend, causal=causal, device=device, **options)

    def make_core(
        self, backend: str, *, causal: bool, device: str | None = None, **options: Any
    ) -> nn.Module:
        """The core `backend` for this block; one whose options take `heads` (per-head
        parameters, e.g. nystrom's conv) is given the block's head count."""
        if "heads" in field_names(get_backend(backend).config):
            options = {"heads": self.num_heads, **options}
        return build_attention(backend, causal=causal, device=device, **options)

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """(b, n, hidden) -> (b, n, hidden)."""
        if x.dim() != 3 or x.shape[-1] != self.hidden_size:
            raise ShapeError(
                f"SelfAttention expects (batch, length, hidden_size={self.hidden_size}), "
                f"got shape {tuple(x.shape)}"
            )
        weights = self.in_proj.weight.split(self.num_heads * self.head_size)
        attend_block = getattr(self.core, "attend_block", None)  # plugin cores may lack it
        if (
            attend_block is not None
            and not self.shared_qk
            and x.dtype == self.in_proj.weight.dtype  # else the projections' own error
            and not _autocasting(x)  # autocast casts each projection on its own
        ):
            check_key_padding_mask(key_padding_mask, x.shape[0], x.shape[1])
            w_q, w_k, w_v = weights
            folded = attend_block(
                x,
                BlockWeights(w_q, w_k, w_v, self.out_proj.weight, self.num_heads),
                key_padding_mask,
            )
            if folded is not None:
                return folded
        q, k, v = self.project(x)
        out = self.core(q, k, v, key_padding_mask=key_padding_mask)
        return self.out_proj(rearrange(out, "b h n d -> b n (h d)"))

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v (b, h, n, d) of x (b, n, hidden); k is q under shared QK."""
        weights = self.in_proj.weight.split(self.num_heads * self.head_size)
        # One matmul per part (slices of the fused weight): each part's gradient then flows to its
        # own matmul, with no stacked (3, b, n, inner) gradient copy in backward.
        parts = [
            rearrange(F.linear(x, w), "b n (h d) -> b h n d", h=self.num_heads) for w in weights
        ]
        if self.shared_qk:
            return parts[0], parts[0], parts[1]
        q, k, v = parts
        return q, k, v

    # ---- decoding (attention/decode.py) ---------------------------------------------------------

    def init_state(
        self,
        batch: int,
        max_length: int,
        *,
        dtype: torch.dtype | None = None,
        recompute: bool = False,
    ) -> decode.DecodeState:
        """An empty decoding state of the core for `batch` sequences of up to max_length
        positions, in the projections' dtype and device unless `dtype` is given."""
        weight = self.in_proj.weight
        shape = decode.StateShape(
            batch, self.num_heads, self.head_size, max_length, dtype or weight.dtype, weight.device
        )
        return decode.init_state(self.core, shape, recompute=recompute)

    def step(
        self, x: Tensor, state: decode.DecodeState, key_padding_mask: Tensor | None = None
    ) -> tuple[Tensor, decode.DecodeState]:
        """(b, t, hidden) new positions -> their outputs (b, t, hidden) and the state after them."""
        out, state = decode.step(self.core, *self.project(x), state, key_padding_mask)
        return self.out_proj(rearrange(out, "b h n d -> b n (h d)")), state


def _autocasting(x: Tensor) -> bool:
    device = x.device.type
    return torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device)


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, min(n, 64) + 1) if n % d == 0)
