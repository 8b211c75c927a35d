"""The family's reference: the recurrence token by token, in plain PyTorch.

S_t = a_t * S_{t-1}; with a step size b_t (the delta rule) S_t += b_t k_t (v_t - k_t^T S_t), else
S_t += k_t v_t^T; o_t = scale * S_t^T q_t. The decay a_t = exp(log_decay_t) is a scalar per head
and token (RetNet, Mamba2's SSD) or a vector over key channels (GLA). O(n) steps: for tests.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from ..sums.plain import compute_dtype

NORM_EPS = 1e-6  # l2_normalised's floor on the norm


def recurrence(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    log_decay: Tensor | None = None,
    beta: Tensor | None = None,
    scale: float = 1.0,
    initial_state: Tensor | None = None,
    normalise_qk: bool = False,
) -> tuple[Tensor, Tensor]:
    """q, k (b, h, n, dk), v (b, h, n, dv), log_decay (b, h, n) or (b, h, n, dk) (<= 0), beta
    (b, h, n) -> o (b, h, n, dv) and the final state (b, h, dk, dv); normalise_qk: q and k
    L2-normalised first."""
    b, h, n, dk = k.shape
    if normalise_qk:
        q, k = l2_normalised(q), l2_normalised(k)
    state = k.new_zeros(b, h, dk, v.shape[-1]) if initial_state is None else initial_state
    outs = []
    for t in range(n):
        kt, vt = k[:, :, t], v[:, :, t]  # (b, h, dk), (b, h, dv)
        if log_decay is not None:
            a = log_decay[:, :, t].exp()
            state = state * (a[..., None, None] if a.dim() == 2 else a[..., None])
        if beta is None:
            state = state + kt[..., None] * vt[..., None, :]
        else:
            error = vt - (kt[..., None] * state).sum(-2)  # v_t - S^T k_t: (b, h, dv)
            state = state + beta[:, :, t, None, None] * kt[..., None] * error[..., None, :]
        outs.append(scale * (q[:, :, t, :, None] * state).sum(-2))
    return torch.stack(outs, dim=2), state


def l2_normalised(x: Tensor) -> Tensor:
    """x / ||x|| over the last dim (16-bit x in float32): the delta rule is stable for unit keys."""
    return F.normalize(x.to(compute_dtype(x.dtype)), dim=-1, eps=NORM_EPS).to(x.dtype)
