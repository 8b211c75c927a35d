"""LSH attention with materialised blocks and plain autograd: the reference, and the CUDA path."""

from __future__ import annotations

import torch
from torch import Tensor

from ..chunked import Workspace, math_attention
from ..dense import unit_keys
from .lsh_plan import LSHPlan, with_self
from .rows import undo_perm


def lsh_math(q: Tensor, k: Tensor, v: Tensor, plan: LSHPlan, *, dropout: float = 0.0) -> Tensor:
    """The same computation with materialised blocks and plain autograd (CUDA, checks, and
    attention dropout: every probability, a query's own included, dropped with `dropout`)."""
    b, h, npad, d = q.shape
    keys = unit_keys(k)
    outs, lses = [], []
    for s, e in plan.groups:
        p = plan.make_pass(s * npad, e * npad, Workspace())
        q4 = p.win.to_blocks(q.reshape(-1, d)[p.positions])  # differentiable gathers
        k_long, v_long = (t.reshape(-1, d)[p.long_flat] for t in (keys, v))
        out4, lse4 = math_attention(q4, k_long, v_long, p.win, p.masks(q.dtype), 1.0, dropout)
        undo = undo_perm(p.plan.perm[:, :, s:e]).view(b, h, (e - s) * npad)
        outs.append(
            torch.gather(out4.reshape(b, h, -1, d), 2, undo[..., None].expand(-1, -1, -1, d)).view(
                b, h, e - s, npad, d
            )
        )
        lses.append(torch.gather(lse4.reshape(b, h, -1), 2, undo).view(b, h, e - s, npad))
    o_r, lse_r = torch.cat(outs, 2), torch.cat(lses, 2)
    lse = torch.logsumexp(lse_r, dim=2)
    out = (o_r * torch.exp(lse_r - lse.unsqueeze(2)).unsqueeze(-1)).sum(2)  # round weights
    return with_self(out, lse, v, plan.perm.shape[2], dropout=dropout)[0]
