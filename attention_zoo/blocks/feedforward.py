"""Position-wise feed-forward, optionally run over slices of the sequence (Reformer, section 4).

The FFN treats every position alone, so slicing the sequence gives the same output while the
(n, feed_forward_size) intermediate only ever exists for `chunk_size` positions at a time.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import ConfigError

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _gelu_tanh(x: Tensor) -> Tensor:
    return 0.5 * x * (1.0 + torch.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * torch.pow(x, 3.0))))


# HF `hidden_act` names -> functions, with transformers' formulas (activations.py); prelu and xielu
# are left out: they carry learned parameters.
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": F.gelu,
    "gelu_10": lambda x: torch.clip(F.gelu(x), -10, 10),
    "gelu_accurate": _gelu_tanh,
    "gelu_fast": lambda x: (
        0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))
    ),
    "gelu_new": _gelu_tanh,
    "gelu_python": lambda x: x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0))),
    "gelu_python_tanh": _gelu_tanh,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "hardswish": F.hardswish,
    "laplace": lambda x: 0.5 * (1.0 + torch.erf((x - 0.707107) / (0.282095 * math.sqrt(2.0)))),
    "leaky_relu": F.leaky_relu,
    "linear": lambda x: x,
    "mish": F.mish,
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "relu": F.relu,
    "relu2": lambda x: torch.square(F.relu(x)),
    "relu6": F.relu6,
    "sigmoid": torch.sigmoid,
    "silu": F.silu,
    "sqrtsoftplus": lambda x: F.softplus(x).sqrt(),
    "swish": F.silu,
    "tanh": torch.tanh,
}


def chunked(fn: Callable[[Tensor], Tensor], x: Tensor, chunk_size: int) -> Tensor:
    """fn over slices of `chunk_size` positions (dim 1), concatenated; 0 = all at once."""
    n = x.shape[1]
    if chunk_size == 0 or chunk_size >= n:
        return fn(x)
    # A Python loop on purpose: slices must run one after another, or the memory saving is gone.
    # The last slice may be shorter (split handles a chunk size that does not divide n).
    return torch.cat([fn(part) for part in x.split(chunk_size, dim=1)], dim=1)


class ChunkedFeedForward(nn.Module):
    """Linear -> dropout -> activation -> Linear (HF's order), `chunk_size` positions at a time."""

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
        return chunked(self._ffn, x, self.chunk_size)

    def _ffn(self, x: Tensor) -> Tensor:
        return self.out(self.act(self.dropout(self.dense(x))))  # HF drops before the activation

    def extra_repr(self) -> str:
        return f"activation={self.activation}, chunk_size={self.chunk_size}"
