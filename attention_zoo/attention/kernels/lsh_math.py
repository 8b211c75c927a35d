"""LSH attention with materialised blocks and plain autograd: the reference, and the CUDA path."""

from __future__ import annotations

import torch
from torch import Tensor

from .chunked import math_attention
from .dense import unit_keys
from .lsh_plan import EPS, LSHPlan, with_self
from .rows import undo_perm


def gather_rows(x: Tensor, perm: Tensor) -> Tensor:
    """x (b, h, n, d) gathered by perm (b, h, g, n) -> (b, h, g * n, d), differentiably."""
    b, h, g, n = perm.shape
    return torch.gather(x, 2, perm.reshape(b, h, g * n, 1).expand(b, h, g * n, x.shape[-1]))


def lsh_math(q: Tensor, k: Tensor, v: Tensor, plan: LSHPlan, *, dropout: float = 0.0) -> Tensor:
    """The same computation with materialised blocks and plain autograd (CUDA, checks, and
    attention dropout: every probability, a query's own included, dropped with `dropout`)."""
    b, h, npad, d = q.shape
    keys = unit_keys(k, EPS)
    outs, lses = [], []
    for s, e in plan.groups:
        perm = plan.perm[:, :, s:e]
        g = e - s
        win = plan.windows(b * h * g, npad, d)
        q4 = win.to_blocks(gather_rows(q, perm).reshape(-1, d))
        pad = (0, 0, win.front, win.back)
        k_long = torch.nn.functional.pad(gather_rows(keys, perm).reshape(-1, d), pad)
        v_long = torch.nn.functional.pad(gather_rows(v, perm).reshape(-1, d), pad)
        masks = plan.masks(s, e, win, q.dtype)
        out4, lse4 = math_attention(q4, k_long, v_long, win, masks, 1.0, dropout)
        undo = undo_perm(perm).view(b, h, g * npad)
        outs.append(
            torch.gather(
                out4.reshape(b, h, g * npad, d), 2, undo[..., None].expand(-1, -1, -1, d)
            ).view(b, h, g, npad, d)
        )
        lses.append(torch.gather(lse4.reshape(b, h, g * npad), 2, undo).view(b, h, g, npad))
    o_r, lse_r = torch.cat(outs, 2), torch.cat(lses, 2)
    lse = torch.logsumexp(lse_r, dim=2)
    out = (o_r * torch.exp(lse_r - lse.unsqueeze(2)).unsqueeze(-1)).sum(2)  # round weights
    return with_self(out, lse, v, plan.perm.shape[2], dropout=dropout)[0]
