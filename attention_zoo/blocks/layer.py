"""One Reformer layer as two residual branches: f = PreNorm(attention), g = PreNorm(feed-forward).

The residual variants (residual.py) only see (f, g); that is what lets the reversible and the plain
paths share weights, so one can be checked against the other.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn


class PreNorm(nn.Module):
    """dropout(fn(LayerNorm(x), *args)): a residual branch without the residual add."""

    def __init__(
        self, hidden_size: int, fn: nn.Module, *, eps: float = 1e-12, dropout: float = 0.0
    ) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden_size, eps=eps)
        self.fn = fn
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, *args: Any) -> Tensor:
        """(b, n, hidden) -> (b, n, hidden)."""
        return self.dropout(self.fn(self.norm(x), *args))


class ReformerLayer(nn.Module):
    """The pair of branches of one layer: f(x, key_padding_mask) attention, g(x) feed-forward."""

    def __init__(self, f: PreNorm, g: PreNorm) -> None:
        super().__init__()
        self.f, self.g = f, g

    @property
    def attention(self) -> nn.Module:
        """The SelfAttention inside f (projections + registered core)."""
        return self.f.fn
