"""The attention sublayer: projections from (b, n, hidden) into any registered core and back."""

from __future__ import annotations

from typing import Any

import torch
from einops import rearrange
from torch import Tensor, nn
from torch.nn import functional as F

from ..attention import decode
from ..attention.base import BlockWeights, check_key_padding_mask
from ..attention.inputs import InputLayout, Inputs
from ..attention.kernels.autocast import autocast_dtype
from ..attention.spec import build_attention, get_backend
from ..declarative import field_names
from ..errors import ConfigError, ShapeError


class SelfAttention(nn.Module):
    """Multi-head self-attention around a registered core.

    The block projects what the core's input layout declares (attention/inputs.py): q, k, v with
    their head counts and widths, and any extra per-token inputs through their squash. A core
    that needs shared QK gets one query/key projection and the same tensor as q and k.
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
        self.layout = self.layout_of(backend, options)
        self.sizes = self.layout.projections(num_heads, head_size)
        # One fused input projection: [q, k, v, extras...] or, under shared QK, [qk, v, ...].
        self.in_proj = nn.Linear(hidden_size, sum(self.sizes.values()), bias=False)
        inner_v = num_heads * head_size * self.layout.expand_v  # the core outputs v's width
        self.out_proj = nn.Linear(inner_v, hidden_size, bias=False)
        self.core = self.make_core(backend, causal=causal, device=device, **options)

    @property
    def kv_heads(self) -> int:
        return self.layout.kv_heads_for(self.num_heads)

    def core_options(self, backend: str, options: dict[str, Any]) -> dict[str, Any]:
        """The core's options: `options`, and the block's head count where the core takes
        `heads` (per-head parameters, e.g. nystrom's conv)."""
        if "heads" in field_names(get_backend(backend).config):
            return {"heads": self.num_heads, **options}
        return dict(options)

    def layout_of(self, backend: str, options: dict[str, Any]) -> InputLayout:
        """The input layout `backend` with `options` declares for this block's core."""
        return get_backend(backend).layout(**self.core_options(backend, options))

    def make_core(
        self, backend: str, *, causal: bool, device: str | None = None, **options: Any
    ) -> nn.Module:
        """The core `backend` for this block (see `core_options`)."""
        options = self.core_options(backend, options)
        return build_attention(backend, causal=causal, device=device, **options)

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """(b, n, hidden) -> (b, n, hidden)."""
        if x.dim() != 3 or x.shape[-1] != self.hidden_size:
            raise ShapeError(
                f"SelfAttention expects (batch, length, hidden_size={self.hidden_size}), "
                f"got shape {tuple(x.shape)}"
            )
        attend_block = getattr(self.core, "attend_block", None)  # plugin cores may lack it
        if (
            attend_block is not None
            and self.layout.plain
            and x.dtype == self.in_proj.weight.dtype  # else the projections' own error
            and autocast_dtype(x) is None  # autocast casts each projection on its own
        ):
            check_key_padding_mask(key_padding_mask, x.shape[0], x.shape[1])
            w_q, w_k, w_v = self.in_proj.weight.split(list(self.sizes.values()))
            folded = attend_block(
                x,
                BlockWeights(w_q, w_k, w_v, self.out_proj.weight, self.num_heads),
                key_padding_mask,
            )
            if folded is not None:
                return folded
        inputs = self.project(x)
        out = self.core(inputs.q, inputs.k, inputs.v, key_padding_mask, **inputs.extras)
        return self.out_proj(rearrange(out, "b h n d -> b n (h d)"))

    def project(self, x: Tensor) -> Inputs:
        """The core's inputs from x (b, n, hidden): q (b, h, n, d), k and v (b, kv, n, *), each
        extra (b, h, n) or (b, h, n, d) through its squash; k is q under shared QK."""
        weights = self.in_proj.weight.split(list(self.sizes.values()))
        # One matmul per part (slices of the fused weight): each part's gradient then flows to its
        # own matmul, with no stacked (3, b, n, inner) gradient copy in backward.
        heads = {"q": self.num_heads, "k": self.kv_heads, "v": self.kv_heads}
        parts = {
            name: rearrange(
                F.linear(x, w), "b n (h d) -> b h n d", h=heads.get(name, self.num_heads)
            )
            for name, w in zip(self.sizes, weights)
        }
        extras = {}
        for extra in self.layout.extras:
            value = extra.squash(parts[extra.name])
            extras[extra.name] = value if extra.per_key_channel else value.squeeze(-1)
        k = parts["q"] if self.layout.shared_qk else parts["k"]
        return Inputs(parts["q"], k, parts["v"], extras)

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
        positions, in the projections' dtype (autocast's, under it) and device unless `dtype` is
        given."""
        weight = self.in_proj.weight
        shape = decode.StateShape(
            batch,
            self.num_heads,
            self.head_size,
            max_length,
            dtype or autocast_dtype(weight) or weight.dtype,
            weight.device,
            kv_heads=self.kv_heads,
            value_dim=self.head_size * self.layout.expand_v,
        )
        return decode.init_state(self.core, shape, recompute=recompute)

    def step(
        self, x: Tensor, state: decode.DecodeState, key_padding_mask: Tensor | None = None
    ) -> tuple[Tensor, decode.DecodeState]:
        """(b, t, hidden) new positions -> their outputs (b, t, hidden) and the state after them."""
        inputs = self.project(x)
        out, state = decode.step(
            self.core, inputs.q, inputs.k, inputs.v, state, key_padding_mask, **inputs.extras
        )
        return self.out_proj(rearrange(out, "b h n d -> b n (h d)")), state


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, min(n, 64) + 1) if n % d == 0)
