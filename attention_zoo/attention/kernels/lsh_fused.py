"""The fused LSH kernel: all hash rounds sorted and attended in one fused-kernel pass, exact
backward one round at a time (nothing round-sized saved).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor
from torch.autograd import Function

from .chunked import Workspace, flash_backward_offset, flash_window_forward
from .lsh_plan import LSHPlan, self_weight, with_self

EPS = 1e-6  # as dense.unit_keys


def undo_perm(perm: Tensor) -> Tensor:
    """Inverse permutations, offset per round so they index a (b, h, g * n) flat sorted sequence."""
    _b, _h, g, n = perm.shape
    undo = torch.empty_like(perm)
    undo.scatter_(-1, perm, torch.arange(n, device=perm.device).expand_as(perm))
    return undo + (torch.arange(g, device=perm.device) * n).view(1, 1, g, 1)


def row_view(x: Tensor) -> tuple[Tensor, Tensor]:
    """(rows (R, d) view of x's data, row index (b, h, n)): x[i, j, p] = rows[index[i, j, p]].

    Sorting is then one index_select of whole rows straight from the projection's layout
    (torch.gather on a strided (b, h, n, d) view is several times slower). A layout that is not
    dense in some order of (b, h, n) is copied once.
    """
    b, h, n, d = x.shape
    order = sorted(range(3), key=lambda i: x.stride(i), reverse=True)  # memory order of b, h, n
    y = x.permute(*order, 3).contiguous()  # a no-op view when x is dense in that order
    sizes = [x.shape[i] for i in order]
    step = {order[2]: 1, order[1]: sizes[2], order[0]: sizes[1] * sizes[2]}  # rows per index step
    ar = functools.partial(torch.arange, device=x.device)
    index = (
        (ar(b) * step[0]).view(b, 1, 1)
        + (ar(h) * step[1]).view(1, h, 1)
        + (ar(n) * step[2]).view(1, 1, n)
    )
    return y.view(-1, d), index


class LSHPass:
    """Index bookkeeping of one pass over hash rounds s:e (g rounds), all flat over (b, h, g, n)."""

    def __init__(
        self, plan: LSHPlan, s: int, e: int, shape: tuple[int, ...], ws: Workspace
    ) -> None:
        b, h, npad, d = shape
        self.perm = plan.perm[:, :, s:e]  # (b, h, g, npad)
        self.g = e - s
        self.ws = ws
        self.win = plan.windows(b * h * self.g, npad, d)
        self.mask_fn = functools.partial(plan.masks, s, e, self.win)
        flat = self.perm + (torch.arange(b * h, device=self.perm.device) * npad).view(b, h, 1, 1)
        self.positions = flat.reshape(-1)  # sorted slot -> flat (b, h, npad) position

    def unsort(self) -> Tensor:
        """Unsorted (b, h, npad, g) -> sorted slot, flat: gathers results back in position order."""
        b, h, _, npad = self.perm.shape
        offsets = torch.arange(b * h, device=self.perm.device) * (self.g * npad)
        return (undo_perm(self.perm).transpose(-1, -2) + offsets.view(b, h, 1, 1)).reshape(-1)

    def masks(self, dtype: torch.dtype):
        return self.mask_fn(dtype, self.ws)

    def combine(
        self, out_sorted: Tensor, lse_sorted: Tensor, like: Tensor
    ) -> tuple[Tensor, Tensor]:
        """This pass's rounds combined in position order: (out (b, h, npad, d), lse (b, h, npad)).

        out_sorted (sorted slots, d) is weighted in place by exp(lse_round - lse_combined) and
        scattered back with index_add (no round-sized unsorted copy)."""
        b, h, npad, d = like.shape
        lse_r = lse_sorted[self.unsort()].view(b, h, npad, self.g)
        lse_g = torch.logsumexp(lse_r, dim=-1)
        del lse_r
        w = torch.exp(lse_sorted - lse_g.view(-1)[self.positions]).unsqueeze(-1)
        out = like.new_zeros((b * h * npad, d))
        out.index_add_(0, self.positions, out_sorted.mul_(w.to(out_sorted.dtype)))
        return out.view(b, h, npad, d), lse_g

    def sort(
        self, rows: tuple[Tensor, Tensor], name: str | None = None, out: Tensor | None = None
    ) -> Tensor:
        """Rows of a (b, h, npad, d) tensor (see `row_view`) in this pass's sorted order."""
        view, index = rows
        if name is not None:
            out = self.ws.get(name, (self.win.length, view.shape[-1]), view)
        return torch.index_select(view, 0, index.reshape(-1)[self.positions], out=out)

    def inputs(
        self, q_rows, k_rows, rk: Tensor, v_rows, shared: bool
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Sorted queries (flat), unit keys and values in long buffers (zero chunks at the ends)."""
        d = q_rows[0].shape[-1]
        q_flat = self.sort(q_rows, "q")
        k_long, k_mid = self.ws.long("k", self.win, (d,), q_flat)
        rk_sorted = rk.view(-1)[self.positions].unsqueeze(-1)
        if shared:  # keys are the queries scaled to unit length: no second gather
            torch.mul(q_flat, rk_sorted, out=k_mid)
        else:
            self.sort(k_rows, out=k_mid).mul_(rk_sorted)
        v_long, v_mid = self.ws.long("v", self.win, (d,), q_flat)
        self.sort(v_rows, out=v_mid)
        return q_flat, k_long, v_long


class LSHFlash(Function):
    """Sort, chunked fused-kernel attention over all rounds, unsort, combine; exact backward.

    Nothing round-sized is saved: backward re-sorts the inputs and rebuilds the masks, one hash
    round at a time (so its working set is one round's, whatever num_hashes is).
    """

    @staticmethod
    def forward(ctx, q, k, v, plan):  # type: ignore[override]
        k = q if k is None else k  # None: shared QK
        _b, _h, _npad, d = q.shape
        rk = torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + EPS)  # unit keys = k * rk
        rows, shared, ws = (row_view(q), row_view(k), row_view(v)), k is q, Workspace()
        fine = plan.regrid(plan.forward_block())
        out = lse = None
        for s, e in fine.groups:
            p = LSHPass(fine, s, e, q.shape, ws)
            q_flat, k_long, v_long = p.inputs(*rows[:2], rk, rows[2], shared)
            mask = p.masks(q.dtype).window()
            out4, lse4 = flash_window_forward(
                p.win.to_blocks(q_flat), k_long, v_long, p.win, mask, 1.0
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
        out, lse = with_self(out, lse, v, plan.perm.shape[2])
        ctx.save_for_backward(q, k, v, rk, out, lse)
        ctx.plan, ctx.shared = plan, shared
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        q, k, v, rk, out, lse = ctx.saved_tensors
        plan = ctx.plan
        b, h, npad, d = q.shape
        rows, ws = (row_view(q), row_view(k), row_view(v)), Workspace()
        grad_rows, out_rows = row_view(grad), row_view(out)
        # q, k (unit keys), v -> flat (b * h * npad, d) in position order, summed over rounds
        dq, dkeys, dv = (q.new_zeros((b * h * npad, d)) for _ in range(3))
        for r in range(plan.perm.shape[2]):  # one round at a time: backward only
            p = LSHPass(plan, r, r + 1, q.shape, ws)
            q_flat, k_long, v_long = p.inputs(*rows[:2], rk, rows[2], ctx.shared)
            g4 = p.win.to_blocks(p.sort(grad_rows, "grad"))
            out4 = p.win.to_blocks(p.sort(out_rows, "out"))
            lse4 = lse.reshape(-1)[p.positions].view(-1, 1, p.win.chunk)
            q4, masks = p.win.to_blocks(q_flat), p.masks(q.dtype)
            for o in p.win.backward_order:
                parts = flash_backward_offset(
                    o, g4, q4, k_long, v_long, out4, lse4, p.win, masks, 1.0
                )
                # the key block of offset o starts `shift` sorted slots after its query block; an
                # index that wraps around lands on a nonexistent key, whose gradient is exactly 0
                shift = (o - p.win.before) * p.win.chunk
                keys = p.positions if shift == 0 else torch.roll(p.positions, -shift)
                for acc, part, index in zip((dq, dkeys, dv), parts, (p.positions, keys, keys)):
                    acc.index_add_(0, index, part.reshape(-1, d))
                del parts, part
            del q4, q_flat, k_long, v_long, g4, out4
            ws.clear()
        dq, dkeys, dv = (t.view(b, h, npad, d) for t in (dq, dkeys, dv))
        dv += self_weight(lse, q.dtype, plan.perm.shape[2]).unsqueeze(-1).to(dv.dtype) * grad
        # keys = k * rk with rk = (|k|^2 + eps)^-1/2: dk = rk * dkeys - rk^3 (k . dkeys) k
        dk = rk * dkeys - rk.pow(3) * (k * dkeys).sum(-1, keepdim=True) * k
        if ctx.shared:  # q was also the keys
            return dq.add_(dk), None, dv, None
        return dq, dk, dv, None
