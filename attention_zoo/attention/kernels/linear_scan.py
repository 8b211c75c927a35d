"""Kernelised attention sums shared by `linear` and `performer`: out_i = phi_q_i S_i / (phi_q_i z_i).

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
    b, h, n, m = phi_q.shape
    d = v.shape[-1]
    # a ones column on v: the numerator and the denominator come out of the same products
    v1 = torch.cat([v, v.new_ones(b, h, n, 1)], dim=-1)  # (b, h, n, d + 1)
    if not causal:
        out = torch.matmul(phi_q, torch.matmul(phi_k.transpose(-1, -2), v1))
    else:
        out = _causal_sums(phi_q, phi_k, v1, chunk)
    return out[..., :d] / (out[..., d:] + eps)


def _causal_sums(phi_q: Tensor, phi_k: Tensor, v1: Tensor, chunk: int) -> Tensor:
    """sum_{j <= i} (phi_q_i . phi_k_j) v1_j for every i, in chunks of `chunk` positions."""
    b, h, n, m = phi_q.shape
    c = min(chunk, n)
    npad = padded_length(n, c)
    if npad != n:  # zero features: padding keys add nothing, padding queries are cut off
        phi_q, phi_k, v1 = (F.pad(t, (0, 0, 0, npad - n)) for t in (phi_q, phi_k, v1))
    nc = npad // c
    qc = phi_q.reshape(b, h, nc, c, m)
    kc = phi_k.reshape(b, h, nc, c, m)
    vc = v1.reshape(b, h, nc, c, v1.shape[-1])
    states = torch.matmul(kc.transpose(-1, -2), vc)  # (b, h, nc, m, d + 1)
    # exclusive prefix: chunk t sees the states of chunks < t (shifted, never a subtraction)
    before = F.pad(states[:, :, :-1], (0, 0, 0, 0, 1, 0)).cumsum(dim=2)
    inter = torch.matmul(qc, before)
    own = torch.ones(c, c, dtype=torch.bool, device=phi_q.device).tril()
    scores = torch.matmul(qc, kc.transpose(-1, -2)) * own  # (b, h, nc, c, c), j <= i only
    out = inter + torch.matmul(scores, vc)
    return out.reshape(b, h, npad, -1)[:, :, :n]
