"""Full attention with shared queries and keys, as in the Reformer (Kitaev et al. 2020, section 2).

Keys are the length-normalised queries; a position attends to itself only when nothing else is
allowed, because under shared QK its score with itself would otherwise dominate.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from .base import AttentionCore, check_dropout
from .kernels.dense import allowed_mask, dense_attention, unit_keys
from .kernels.dispatch import KernelTable, materialised
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

    def _dense(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        n = q.shape[-2]
        allowed = allowed_mask(
            n, causal=self.causal, key_padding_mask=key_padding_mask, device=q.device
        )
        return dense_attention(
            q, unit_keys(k), v, allowed, scale=1.0, penalise_self=True, dropout=self.dropout_p
        )


KERNELS = KernelTable(
    (materialised(SharedQKAttention._dense, "materialised n x n scores with autograd"),),
    {"cpu": ("math",), "meta": ("math",), "cuda": ("math",)},
)
SharedQKAttention.kernels = KERNELS
