"""The fused kernel of round-sorted chunked attention (LSH, and HF-semantics local as one round):
rounds combined online, a bounded slice of the sorted sequence at a time, exact backward.

Forward: each pass (whole rounds of a short sequence, or a slice of one round of a long one, see
`rows.pass_slots`) sorts only its slots, attends them in one fused-kernel call and folds its block
output into the running output by log-sum-exp. Saved for the backward: q, k, v, the output, the
combined log-sum-exp and the plan (the bucket order per round, integers); the backward recomputes
each slice from them. Sorted copies of the inputs never exist for more than one pass, so the
working set is that of the mechanism (inputs, output, their gradients) plus a constant.

It runs any plan that says how a pass lays out its inputs (`make_pass`), how the fused forward
regrids (`forward_plan`), its score scale, its key normalisation (`key_eps`: keys * (|k|^2 +
eps)^-1/2, or None for keys as given) and whether a query's own position is a separate partial
(`self_partial`, see `lsh_plan.with_self`).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd import Function

from ..backward import hand_written_backward
from ..chunked import Workspace, flash_backward_offset, flash_window_forward
from .lsh_plan import with_self
from .rows import BACKWARD_PASS_BYTES, FORWARD_PASS_BYTES, row_view


class RoundsFlash(Function):
    """Sorted chunked fused-kernel attention over all rounds, merged online; exact backward.

    A Python loop over passes (a count fixed by the shapes: rounds and a constant slice size)
    rather than one call over every round: all rounds at once would hold every round's sorted
    q, k, v and masks (several times SDPA's peak when long); a short sequence still runs
    all its rounds in one pass.
    """

    @staticmethod
    def forward(ctx, q, k, v, plan):  # type: ignore[override]
        k = q if k is None else k  # None: shared QK
        b, h, npad, d = q.shape
        rounds = plan.perm.shape[2]
        rk = None  # keys = k * rk
        if plan.key_eps is not None:
            rk = torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + plan.key_eps)
        rows, shared, ws = (row_view(q), row_view(k), row_view(v)), k is q, Workspace()
        fine = plan.forward_plan()
        out = lse = None
        for start, stop in fine.passes(q, FORWARD_PASS_BYTES, fine.rounds_cap):
            p = fine.make_pass(start, stop, ws)
            q_flat, k_long, v_long = p.inputs(*rows[:2], rk, rows[2], shared)
            mask = p.masks(q.dtype).window()
            out4, lse4 = flash_window_forward(
                p.win.to_blocks(q_flat), k_long, v_long, p.win, mask, plan.scale
            )
            del mask, q_flat, k_long, v_long
            o_p, lse_p = out4.view(-1, d), lse4.reshape(-1)
            if p.whole_rounds:
                ws.clear()  # the sorted inputs and the mask: free before unsorting
                o_g, lse_g = p.combine(o_p, lse_p, q)
                if out is None:
                    out, lse = o_g, lse_g
                else:  # fold these rounds into the running total (online log-sum-exp)
                    new = torch.logaddexp(lse, lse_g)
                    out.mul_(torch.exp(lse - new).unsqueeze(-1).to(out.dtype))
                    out.addcmul_(o_g, torch.exp(lse_g - new).unsqueeze(-1).to(out.dtype))
                    lse = new
            else:  # part of a round: fold its rows in place
                if out is None:
                    out = q.new_zeros((b * h * npad, d))
                    lse = torch.full(
                        (b * h * npad,), -torch.inf, dtype=lse_p.dtype, device=q.device
                    )
                p.merge(out, lse, o_p, lse_p)
            del out4, lse4, o_p, lse_p
        out, lse = out.view(b, h, npad, d), lse.view(b, h, npad)
        own = None  # weight of each query's own value
        if plan.self_partial:
            out, lse, own = with_self(out, lse, v, rounds, scale=plan.self_scale(v.dtype))
        ctx.save_for_backward(q, k, v, rk, out, lse, own)
        ctx.plan, ctx.shared = plan, shared
        return out

    @staticmethod
    @hand_written_backward
    def backward(ctx, grad):  # type: ignore[override]
        q, k, v, rk, out, lse, own = ctx.saved_tensors
        plan = ctx.plan
        b, h, npad, d = q.shape
        rows, ws = (row_view(q), row_view(k), row_view(v)), Workspace()
        grad_rows, out_rows = row_view(grad), row_view(out)
        # q, k (the kernel's keys), v -> flat (b * h * npad, d) in position order, over rounds
        dq, dkeys, dv = (q.new_zeros((b * h * npad, d)) for _ in range(3))
        for start, stop in plan.passes(q, BACKWARD_PASS_BYTES, 1):
            p = plan.make_pass(start, stop, ws)
            q_flat, k_long, v_long = p.inputs(*rows[:2], rk, rows[2], ctx.shared)
            g4 = kernel_layout(p, grad_rows, "grad")
            out4 = p.win.to_blocks(p.sort(out_rows, "out"))
            lse4 = lse.reshape(-1)[p.positions].view(g4.shape[:-1])
            q4, masks = p.win.to_blocks(q_flat), p.masks(q.dtype)
            for o in p.win.backward_order:
                parts = flash_backward_offset(
                    o, g4, q4, k_long, v_long, out4, lse4, p.win, masks, plan.scale
                )
                keys = p.key_index(o)
                for acc, part, index in zip((dq, dkeys, dv), parts, (p.positions, keys, keys)):
                    acc.index_add_(*memory_rows(part, index))
                del parts, part
            del q4, q_flat, k_long, v_long, g4, out4, lse4, masks
        ws.clear()
        dq, dk, dv = (t.view(b, h, npad, d) for t in (dq, dkeys, dv))
        del dkeys
        if own is not None:
            dv.addcmul_(own.unsqueeze(-1).to(dv.dtype), grad)
        if rk is not None:  # keys = k * rk with rk = (|k|^2 + eps)^-1/2, in place
            radial = torch.matmul(k.unsqueeze(-2), dk.unsqueeze(-1)).squeeze(-1)  # (k . dkeys)
            dk.mul_(rk).addcmul_(k, rk.pow(3).mul_(radial), value=-1)
        if ctx.shared:  # q was also the keys
            return dq.add_(dk), None, dv, None
        return dq, dk, dv, None


def memory_rows(part: Tensor, index: Tensor) -> tuple[int, Tensor, Tensor]:
    """index_add_ arguments for a (B, H, L, d) block result: its rows in memory order and the
    index permuted to match. The CPU kernel's gradients are laid out (B, L, H, d); reading them
    so avoids a copy of each (and its time) per window offset."""
    d = part.shape[-1]
    if part.is_contiguous():
        return 0, index, part.view(-1, d)
    blh = part.transpose(1, 2)
    if blh.is_contiguous():
        return 0, index.view(part.shape[:3]).transpose(1, 2).reshape(-1), blh.view(-1, d)
    return 0, index, part.reshape(-1, d)


def kernel_layout(p, rows: tuple[Tensor, Tensor], name: str) -> Tensor:
    """A pass's sorted rows as (B, H, L, d) blocks laid out (B, L, H, d) in memory: how the CPU
    kernel's backward wants the output gradient (given any other layout, it copies it first)."""
    blocks = p.win.to_blocks(p.positions.view(-1, 1))  # (B, H, L, 1) flat positions
    order = blocks.transpose(1, 2).reshape(-1)  # memory order (B, L, H)
    view, index = rows
    flat = p.ws.get(name, (order.numel(), view.shape[-1]), view)
    torch.index_select(view, 0, index.reshape(-1)[order], out=flat)
    b_, h_, l_ = blocks.shape[:3]
    return flat.view(b_, l_, h_, -1).transpose(1, 2)
