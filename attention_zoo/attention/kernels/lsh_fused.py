"""The fused kernel of round-sorted chunked attention (LSH, and HF-semantics local as one round):
all rounds sorted and attended in fused-kernel passes, exact backward one round at a time (nothing
round-sized saved).

It runs any plan that says how a pass lays out its inputs (`make_pass`), how the fused forward
regrids (`forward_plan`), its score scale, its key normalisation (`key_eps`: keys * (|k|^2 +
eps)^-1/2, or None for keys as given) and whether a query's own position is a separate partial
(`self_partial`, see `lsh_plan.with_self`).
"""

from __future__ import annotations

import torch
from torch.autograd import Function

from .chunked import Workspace, flash_backward_offset, flash_window_forward
from .lsh_plan import with_self
from .rows import row_view


class RoundsFlash(Function):
    """Sort, chunked fused-kernel attention over all rounds, unsort, combine; exact backward.

    Nothing round-sized is saved: backward re-sorts the inputs and rebuilds the masks, one round
    at a time (so its working set is one round's, whatever the number of rounds).
    """

    @staticmethod
    def forward(ctx, q, k, v, plan):  # type: ignore[override]
        k = q if k is None else k  # None: shared QK
        _b, _h, _npad, d = q.shape
        rounds = plan.perm.shape[2]
        rk = None  # keys = k * rk
        if plan.key_eps is not None:
            rk = torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + plan.key_eps)
        rows, shared, ws = (row_view(q), row_view(k), row_view(v)), k is q, Workspace()
        fine = plan.forward_plan()
        out = lse = None
        for s, e in fine.groups:
            p = fine.make_pass(s, e, q.shape, ws)
            q_flat, k_long, v_long = p.inputs(*rows[:2], rk, rows[2], shared)
            mask = p.masks(q.dtype).window()
            out4, lse4 = flash_window_forward(
                p.win.to_blocks(q_flat), k_long, v_long, p.win, mask, plan.scale
            )
            del mask, q_flat, k_long, v_long
            ws.clear()  # the sorted inputs and the mask: free before unsorting
            o_g, lse_g = p.combine(out4.view(-1, d), lse4.reshape(-1), q)
            del out4, lse4
            if out is None:
                out, lse = o_g, lse_g
            else:  # fold this pass into the running total (online log-sum-exp)
                new = torch.logaddexp(lse, lse_g)
                out.mul_(torch.exp(lse - new).unsqueeze(-1).to(out.dtype))
                out.add_(o_g.mul_(torch.exp(lse_g - new).unsqueeze(-1).to(out.dtype)))
                lse = new
        own = None  # weight of each query's own value
        if plan.self_partial:
            out, lse, own = with_self(out, lse, v, rounds, scale=plan.self_scale(v.dtype))
        ctx.save_for_backward(q, k, v, rk, out, lse, own)
        ctx.plan, ctx.shared = plan, shared
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        q, k, v, rk, out, lse, own = ctx.saved_tensors
        plan = ctx.plan
        b, h, npad, d = q.shape
        rows, ws = (row_view(q), row_view(k), row_view(v)), Workspace()
        grad_rows, out_rows = row_view(grad), row_view(out)
        # q, k (the kernel's keys), v -> flat (b * h * npad, d) in position order, over rounds
        dq, dkeys, dv = (q.new_zeros((b * h * npad, d)) for _ in range(3))
        for r in range(plan.perm.shape[2]):  # one round at a time: backward only
            p = plan.make_pass(r, r + 1, q.shape, ws)
            q_flat, k_long, v_long = p.inputs(*rows[:2], rk, rows[2], ctx.shared)
            g4 = p.win.to_blocks(p.sort(grad_rows, "grad"))
            out4 = p.win.to_blocks(p.sort(out_rows, "out"))
            lse4 = lse.reshape(-1)[p.positions].view(g4.shape[:-1])
            q4, masks = p.win.to_blocks(q_flat), p.masks(q.dtype)
            for o in p.win.backward_order:
                parts = flash_backward_offset(
                    o, g4, q4, k_long, v_long, out4, lse4, p.win, masks, plan.scale
                )
                keys = p.key_index(o)
                for acc, part, index in zip((dq, dkeys, dv), parts, (p.positions, keys, keys)):
                    acc.index_add_(0, index, part.reshape(-1, d))
                del parts, part
            del q4, q_flat, k_long, v_long, g4, out4
            ws.clear()
        dq, dkeys, dv = (t.view(b, h, npad, d) for t in (dq, dkeys, dv))
        if own is not None:
            dv += own.unsqueeze(-1).to(dv.dtype) * grad
        dk = dkeys
        if rk is not None:  # keys = k * rk with rk = (|k|^2 + eps)^-1/2
            dk = rk * dkeys - rk.pow(3) * (k * dkeys).sum(-1, keepdim=True) * k
        if ctx.shared:  # q was also the keys
            return dq.add_(dk), None, dv, None
        return dq, dk, dv, None
