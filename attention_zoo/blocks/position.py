"""Learned position embeddings: a standard table, or axial factors (Kitaev et al. 2020; HF's axial).

Axial: n_max = n1 * n2 positions, width d = d1 + d2; position j gets
concat(E1[j mod n1], E2[j // n1]), so n1*d1 + n2*d2 parameters instead of n_max*d. Any length up
to n_max works: a shorter sequence uses the first positions (HF instead requires length == n_max
in training).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..errors import ConfigError, ShapeError


def _check_length(n: int, limit: int) -> None:
    if not 1 <= n <= limit:
        raise ShapeError(
            f"sequence length {n} is outside 1..max_position_embeddings={limit}; use a sequence of "
            f"at most {limit} positions or build the model with a larger max_position_embeddings "
            f"(for axial positions: a larger axial_pos_shape product)"
        )


class TablePositionEmbedding(nn.Module):
    """One learned vector per position: max_positions * hidden_size parameters."""

    def __init__(self, max_positions: int, hidden_size: int, *, init_std: float = 0.02) -> None:
        super().__init__()
        self.max_positions = max_positions
        self.weight = nn.Parameter(torch.empty(max_positions, hidden_size))
        nn.init.normal_(self.weight, std=init_std)

    def forward(self, n: int) -> Tensor:
        """Embeddings of positions 0..n-1: (n, hidden)."""
        _check_length(n, self.max_positions)
        return self.weight[:n]


class AxialPositionEmbedding(nn.Module):
    """Factorised positions: E_k of shape (n_k, d_k); position j concatenates E_k[digit_k(j)].

    digit_k(j) = (j // (n_1 ... n_{k-1})) mod n_k; with two factors, E1[j mod n1] and E2[j // n1].
    """

    def __init__(self, shape: Sequence[int], dims: Sequence[int], *, init_std: float = 1.0) -> None:
        super().__init__()
        shape, dims = tuple(shape), tuple(dims)
        if len(shape) != len(dims) or not shape:
            raise ConfigError(
                f"axial_pos_shape {shape} and axial_pos_embds_dim {dims} must have the same, "
                f"non-zero number of factors"
            )
        self.shape, self.dims = shape, dims
        self.max_positions = math.prod(shape)
        self.weights = nn.ParameterList(
            nn.Parameter(torch.empty(n_k, d_k).normal_(std=init_std))
            for n_k, d_k in zip(shape, dims)
        )
        # Stride of factor k in the mixed-radix position index: 1, n1, n1*n2, ...
        self._strides = tuple(math.prod(shape[:k]) for k in range(len(shape)))

    def forward(self, n: int) -> Tensor:
        """Embeddings of positions 0..n-1: (n, sum(dims))."""
        _check_length(n, self.max_positions)
        j = torch.arange(n, device=self.weights[0].device)
        parts = [w[(j // s) % n_k] for w, s, n_k in zip(self.weights, self._strides, self.shape)]
        return torch.cat(parts, dim=-1)

    def extra_repr(self) -> str:
        return f"shape={self.shape}, dims={self.dims}"
