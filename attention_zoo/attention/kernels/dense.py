"""Materialised softmax attention under an explicit mask: what every mechanism reduces to."""

from __future__ import annotations

import torch
from torch import Tensor

from ..dispatch import expand_kv
from .exp import logsumexp
from .masks import mask_value, real_keys_mask, self_mask_value

KEY_EPS = 1e-6  # added to |k|^2 under the unit keys' inverse square root


def unit_keys(k: Tensor, eps: float = KEY_EPS) -> Tensor:
    """Keys scaled to unit length: the Reformer's (and HF's) shared-QK keys, no 1/sqrt(d) on top."""
    return k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + eps)


def causal_mask(n: int, device: torch.device | str | None = None) -> Tensor:
    """(n, n) bool, True where query i may see key j (j <= i)."""
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def allowed_mask(
    n: int, *, causal: bool, key_padding_mask: Tensor | None, device: torch.device
) -> Tensor | None:
    """Broadcastable (b|1, 1, n|1, n) bool of allowed (query, key) pairs, or None when all are."""
    allowed = causal_mask(n, device)[None, None] if causal else None
    if key_padding_mask is not None:
        keys = real_keys_mask(key_padding_mask)
        allowed = keys if allowed is None else allowed & keys
    return allowed


def dense_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    allowed: Tensor | None = None,
    *,
    scale: float,
    penalise_self: bool = False,
    return_lse: bool = False,
    dropout: float = 0.0,
) -> Tensor | tuple[Tensor, Tensor]:
    """The one dense softmax, softmax(q k^T * scale + mask) v: q (..., t, d), k and v (..., n, d)
    (on fewer heads than q: shared by groups of query heads), `allowed` broadcasting to
    (..., t, n).

    penalise_self: a query sees its own key only when no other key is allowed (shared-QK rule).
    return_lse: also return the log-sum-exp of the masked scores, (..., t).
    dropout: probability of zeroing each attention probability (the rest scaled by 1/(1 - p)).
    """
    k, v = expand_kv(q, k), expand_kv(q, v)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # (..., t, n)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, mask_value(scores.dtype))
    if penalise_self:
        n = scores.shape[-1]
        eye = torch.eye(n, dtype=torch.bool, device=scores.device)
        scores = scores.masked_fill(eye, self_mask_value(scores.dtype))
    probs = torch.softmax(scores, dim=-1)
    if dropout:
        probs = torch.nn.functional.dropout(probs, dropout)
    out = torch.matmul(probs, v)
    return (out, logsumexp(scores)) if return_lse else out
