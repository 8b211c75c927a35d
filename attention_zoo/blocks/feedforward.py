"""Position-wise feed-forward, optionally run over slices of the sequence (Reformer, section 4).

The FFN treats every position alone, so slicing the sequence gives the same output while the
(n, feed_forward_size) intermediate only ever exists for `chunk_size` positions at a time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import ConfigError

# HF `hidden_act` names -> functions.
ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "swish": F.silu,
    "tanh": torch.tanh,
}


class ChunkedFeedForward(nn.Module):
    """Linear -> activation -> dropout -> Linear, `chunk_size` positions at a time (0 = all)."""

    def __init__(
        self,
        hidden_size: int,
        feed_forward_size: int,
        *,
        activation: str = "relu",
        dropout: float = 0.0,
        chunk_size: int = 0,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ConfigError(f"unknown hidden_act {activation!r}; known: {', '.join(ACTIVATIONS)}")
        if chunk_size < 0:
            raise ConfigError(
                f"chunk_size_feed_forward must be >= 0 (0 = unchunked), got {chunk_size}"
            )
        self.dense = nn.Linear(hidden_size, feed_forward_size)
        self.out = nn.Linear(feed_forward_size, hidden_size)
        self.act = ACTIVATIONS[activation]
        self.activation = activation
        self.dropout = nn.Dropout(dropout)
        self.chunk_size = chunk_size

    def forward(self, x: Tensor) -> Tensor:
        """(b, n, hidden) -> (b, n, hidden)."""
        n = x.shape[1]
        if self.chunk_size == 0 or self.chunk_size >= n:
            return self._ffn(x)
        # A Python loop on purpose: slices must run one after another, or the memory saving is gone.
        # The last slice may be shorter (split handles a chunk size that does not divide n).
        return torch.cat([self._ffn(part) for part in x.split(self.chunk_size, dim=1)], dim=1)

    def _ffn(self, x: Tensor) -> Tensor:
        return self.out(self.dropout(self.act(self.dense(x))))

    def extra_repr(self) -> str:
        return f"activation={self.activation}, chunk_size={self.chunk_size}"
