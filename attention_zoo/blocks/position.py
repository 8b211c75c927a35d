"""Learned position embeddings: a standard table, or axial factors (Kitaev et al. 2020; HF layout);
or none, for models that must run past the positions they trained on.

Axial: n_max = n1 * n2 positions, width d = d1 + d2; position j gets concat(E1[j // n2], E2[j % n2])
(the row-major (n1, n2) grid, flattened), so n1*d1 + n2*d2 parameters instead of n_max*d. Any length
up to n_max works: a shorter sequence uses the first positions (HF instead requires length == n_max
in training). Dropout follows HF: the table's output elementwise; the axial factors by whole columns
of the grid (HF's dropout2d over the second axis).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..errors import ConfigError, ShapeError


def check_length(n: int, limit: int) -> None:
    if not 1 <= n <= limit:
        raise ShapeError(
            f"sequence length {n} is outside 1..max_position_embeddings={limit}; use a sequence of "
            f"at most {limit} positions or build the model with a larger max_position_embeddings"
        )


class TablePositionEmbedding(nn.Module):
    """One learned vector per position: max_positions * hidden_size parameters."""

    def __init__(
        self, max_positions: int, hidden_size: int, *, init_std: float = 0.02, dropout: float = 0.0
    ) -> None:
        super().__init__()
        self.max_positions = max_positions
        self.weight = nn.Parameter(torch.empty(max_positions, hidden_size))
        self.dropout = dropout
        nn.init.normal_(self.weight, std=init_std)

    def forward(self, n: int, batch: int = 1, *, start: int = 0) -> Tensor:
        """Embeddings of positions start..start+n-1: (1, n, hidden), or (batch, n, hidden) under
        dropout."""
        check_length(start + n, self.max_positions)
        table = self.weight[start : start + n].unsqueeze(0)
        if not (self.training and self.dropout > 0):
            return table
        return F.dropout(table.expand(batch, -1, -1), self.dropout, training=True)


class NoPositionEmbedding(nn.Module):
    """No position information: zeros, so the tokens alone enter the layers (no parameters)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.register_buffer("zero", torch.zeros(()), persistent=False)  # follows device, dtype

    def forward(self, n: int, batch: int = 1, *, start: int = 0) -> Tensor:
        """Zeros for positions start..start+n-1: (1, n, hidden), a broadcast view."""
        return self.zero.expand(1, n, self.hidden_size)


class AxialPositionEmbedding(nn.Module):
    """Factorised positions: E_k (n_k, d_k); position j concatenates E_k[digit_k(j)].

    digit_k(j) is j's index along axis k of the row-major (n_1, ..., n_K) grid; with two factors,
    E1[j // n2] and E2[j % n2]. Weights keep HF's broadcastable shapes (n1, 1, d1), (1, n2, d2).
    """

    def __init__(
        self,
        shape: Sequence[int],
        dims: Sequence[int],
        *,
        init_std: float = 1.0,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        shape, dims = tuple(shape), tuple(dims)
        if len(shape) != len(dims) or not shape:
            raise ConfigError(
                f"axial_pos_shape {shape} and axial_pos_embds_dim {dims} must have the same, "
                f"non-zero number of factors"
            )
        self.shape, self.dims, self.dropout = shape, dims, dropout
        self.max_positions = math.prod(shape)
        axes = len(shape)
        self.weights = nn.ParameterList(
            nn.Parameter(
                torch.empty(*(n_k if a == k else 1 for a in range(axes)), d_k).normal_(std=init_std)
            )
            for k, (n_k, d_k) in enumerate(zip(shape, dims))
        )
        # Stride of axis k in the row-major grid: n2 * ... * nK, ..., nK, 1.
        self._strides = tuple(math.prod(shape[k + 1 :]) for k in range(axes))

    def digits(self, n: int, axis: int, start: int = 0) -> Tensor:
        """Index along `axis` of positions start..start+n-1: (n,) long."""
        j = torch.arange(start, start + n, device=self.weights[0].device)
        return (j // self._strides[axis]) % self.shape[axis]

    def forward(self, n: int, batch: int = 1, *, start: int = 0) -> Tensor:
        """Embeddings of positions start..start+n-1: (1, n, d), or (batch, n, d) under dropout."""
        if not 1 <= start + n <= self.max_positions:
            raise ShapeError(
                f"sequence length {start + n} is outside 1..{self.max_positions}, the "
                f"axial_pos_shape {self.shape} product; use at most {self.max_positions} "
                "positions or a larger axial_pos_shape"
            )
        parts = [
            w.reshape(n_k, d_k)[self.digits(n, k, start)]
            for k, (w, n_k, d_k) in enumerate(zip(self.weights, self.shape, self.dims))
        ]
        table = torch.cat(parts, dim=-1).unsqueeze(0)
        if not (self.training and self.dropout > 0):
            return table
        # HF drops whole columns of the (n1, n2) grid: one keep/drop draw per (batch, j % n2).
        axis = 1 if len(self.shape) > 1 else 0
        keep = table.new_empty(batch, self.shape[axis]).bernoulli_(1 - self.dropout)
        keep = keep.div_(1 - self.dropout)[:, self.digits(n, axis, start)]
        return table * keep.unsqueeze(-1)

    def extra_repr(self) -> str:
        return f"shape={self.shape}, dims={self.dims}, dropout={self.dropout}"
