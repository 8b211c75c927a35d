"""Kernelised attention sums shared by `linear` and `performer`: phi_q_i S_i / (phi_q_i z_i).

S = sum_j phi_k_j v_j^T and z = sum_j phi_k_j over all keys (bidirectional) or keys j <= i (causal).
Causal runs chunk by chunk (Katharopoulos et al. 2020, section 3.3, in its chunked form): the keys
of earlier chunks enter through exclusive prefix sums of per-chunk states (b, h, n/c, m, d), the
keys of a query's own chunk through a masked c x c product, so no (n, m, d) tensor ever exists.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from .chunked import padded_length

# 16-bit inputs sum their states in float32: the d x d states add up n terms.
_WIDE = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype sums and inverses are computed in: float32 for 16-bit inputs, else the input's."""
    return _WIDE.get(dtype, dtype)


def linear_attention(
    phi_q: Tensor, phi_k: Tensor, v: Tensor, *, causal: bool, chunk: int, eps: float
) -> Tensor:
    """(b, h, n, m) features of queries and keys, (b, h, n, d) values -> (b, h, n, d).

    A key whose features are zero (padding) contributes nothing; eps keeps the denominator > 0.
    """
    if causal:
        num, den = _causal_sums(phi_q, phi_k, v, chunk)
    else:
        num = torch.matmul(phi_q, torch.matmul(phi_k.transpose(-1, -2), v))
        den = torch.matmul(phi_q, phi_k.sum(-2, keepdim=True).transpose(-1, -2))
    return num / (den + eps)


def _causal_sums(phi_q: Tensor, phi_k: Tensor, v: Tensor, chunk: int) -> tuple[Tensor, Tensor]:
    """sum_{j <= i} (phi_q_i . phi_k_j) v_j (b, h, n, d) and sum_{j <= i} phi_q_i . phi_k_j
    (b, h, n, 1), in chunks of `chunk` positions."""
    b, h, n, m = phi_q.shape
    d = v.shape[-1]
    c = min(chunk, n)
    npad = padded_length(n, c)
    if npad != n:  # zero features: padding keys add nothing, padding queries are cut off
        phi_q, phi_k, v = (F.pad(t, (0, 0, 0, npad - n)) for t in (phi_q, phi_k, v))
    nc = npad // c
    qc = phi_q.reshape(b, h, nc, c, m)
    kc = phi_k.reshape(b, h, nc, c, m)
    vc = v.reshape(b, h, nc, c, d)
    # own chunk: a masked c x c product (masked in place: matmul keeps its inputs, not its output)
    scores = torch.matmul(qc, kc.transpose(-1, -2)).tril_()  # (b, h, nc, c, c), j <= i
    # earlier chunks: exclusive prefix sums of per-chunk states, shifted by one chunk (never a
    # subtraction); whole-tensor products only (a slice of the chunks would be copied to multiply)
    states = torch.matmul(kc.transpose(-1, -2), vc)  # (b, h, nc, m, d)
    before = F.pad(states[:, :, :-1], (0, 0, 0, 0, 1, 0)).cumsum(dim=2)
    num = torch.matmul(scores, vc).add_(torch.matmul(qc, before))
    sums = F.pad(kc.sum(-2)[:, :, :-1], (0, 0, 1, 0)).cumsum(dim=2)  # (b, h, nc, m)
    den = scores.sum(-1, keepdim=True).add_(torch.matmul(qc, sums.unsqueeze(-1)))
    return num.reshape(b, h, npad, d)[:, :, :n], den.reshape(b, h, npad, 1)[:, :, :n]
