"""The family's reference: kernelised attention as its quadratic form, out = (A v) / (A 1 + eps)
with A_ij = phi(q_i) . phi(k_j) (j <= i when causal). O(n^2): for tests at small lengths."""

from __future__ import annotations

import torch
from torch import Tensor

from .plain import KernelSums


def quadratic_sums(
    sums: KernelSums, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None
) -> Tensor:
    """(b, h, n, d) in compute_dtype(q.dtype), every pair's weight materialised."""
    phi_q, phi_k = sums.features(q, k, key_padding_mask)
    weights = torch.matmul(phi_q, phi_k.transpose(-1, -2))  # (b, h, n, n)
    if sums.causal:
        weights = weights.tril()
    num = torch.matmul(weights, v.to(weights.dtype))
    return num / (weights.sum(-1, keepdim=True) + sums.eps)
