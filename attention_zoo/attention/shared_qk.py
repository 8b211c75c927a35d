"""Full attention with shared queries and keys, as in the Reformer (Kitaev et al. 2020, section 2).

Keys are the length-normalised queries; a position attends to itself only when nothing else is
allowed, because under shared QK its score with itself would otherwise dominate.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .base import AttentionCore, check_dropout, mask_value, self_mask_value
from .decode import KVCache, append, causal_allowed, kv_cache, kv_cache_bytes
from .dispatch import KernelTable, materialised
from .kernels.dense import dense_attention, unit_keys
from .spec import Capabilities, register_attention


@dataclass(frozen=True, kw_only=True)
class SharedQKConfig:
    """Options of shared-QK full attention."""

    dropout: float = 0.0  # attention-probability dropout, in training mode only
    kernel: str = "auto"  # auto or math: one implementation

    def __post_init__(self) -> None:
        check_dropout("shared-qk", self.dropout)
        KERNELS.check_option("shared-qk", self.kernel)


@register_attention("shared-qk", config=SharedQKConfig, caps=Capabilities(shared_qk=True))
class SharedQKAttention(AttentionCore):
    """Full attention on shared QK: scores q_i . k_j/|k_j|, self masked unless alone. O(n^2)."""

    cache_positions = True  # its KV-cache step reads positions from the cache

    def _dense(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        allowed = self.allowed(q, key_padding_mask)
        return dense_attention(
            q, unit_keys(k), v, allowed, scale=1.0, penalise_self=True, dropout=self.dropout_p
        )

    # ---- decoding: a KV cache of unit keys ---------------------------------------------------

    init_state = staticmethod(kv_cache)
    state_bytes = staticmethod(kv_cache_bytes)

    def step(
        self, q: Tensor, k: Tensor, v: Tensor, state: KVCache, key_padding_mask: Tensor | None
    ) -> tuple[Tensor, KVCache]:
        """New tokens against every cached unit key, self penalised (see attention/decode.py)."""
        start, t = state.length, q.shape[2]
        state = append(state, unit_keys(k), v, key_padding_mask)
        if start == 0:
            return self.attend(q, k, v, key_padding_mask), state
        scores = torch.matmul(q, state.keys().transpose(-1, -2))  # (b, h, t, n)
        allowed = causal_allowed(state, t)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, mask_value(scores.dtype))
        own = state.key_positions()[None, :] == state.new_positions(t)[:, None]
        scores = scores.masked_fill(own, self_mask_value(scores.dtype))
        return torch.matmul(torch.softmax(scores, dim=-1), state.values()), state


KERNELS = KernelTable(
    (materialised(SharedQKAttention._dense, "materialised n x n scores with autograd"),),
    {"cpu": ("math",), "cuda": ("math",)},
)
SharedQKAttention.kernels = KERNELS
