"""NSA's three branches in one autograd node: o = g_cmp o_cmp + g_slc o_slc + g_swa o_swa, the
selected and the window branches on key-block tiles (tiled.py), the compressed one a segment of
queries at a time.

Each branch's output is added into o as it is made. The backward first takes the selected and
window branches' row sums of dO * o (their gates' gradients and, gated, their softmax's deltas)
and frees the outputs it kept, then adds every branch's gradients into one set of q, k, v
gradients; the compressed branch is recomputed a segment at a time, its row sums with it.
Composed by autograd instead, each branch would keep its output until its own backward and hand
back a fresh set of gradients to be summed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.autograd import Function

from ..backward import hand_written_backward
from ..sums.plain import compute_dtype
from .compressed import compressed_part, query_spans
from .route import Route, add_block_means_grad, from_blocks
from .tiled import Tiles, plan_tiles, tiled_backward, tiled_forward, zero_grads

SCRATCH_BYTES = 24 << 20  # the node's segments of tiles: larger than alone, it runs on long inputs


def pays(rows: int, length: int, value_dim: int) -> bool:
    """Whether the node is worth its time (its window on tiles is slower than the window kernel)
    for `rows` = batch x query heads: when what it saves, about a branch output and a set of
    gradients (four float32 outputs' size), is at least a segment of the tiles' scratch."""
    return 4 * rows * length * value_dim * 4 >= SCRATCH_BYTES


def hooks_saving() -> bool:
    """Whether saved-tensor hooks are active (checkpointing, offloading): outputs the node kept
    would bypass them, so it then keeps none and its backward remakes them. A torch without
    the query counts as hooks active (correct, only slower)."""
    try:
        return torch._C._autograd._top_saved_tensors_default_hooks(False) is not None
    except (AttributeError, TypeError, RuntimeError):
        return True


@dataclass(frozen=True)
class Branches:
    """What the three branches read besides q, k, v and the gates."""

    selected: Tiles  # the routed blocks
    window: Tiles  # the blocks of each query's window
    pooled_k: Tensor  # (b, kv, nb, d) block means of the keys, in k's dtype
    pooled_v: Tensor  # (b, kv, nb, d_v) of the values
    has: Tensor  # (b, nb) which blocks hold a real key
    real: Tensor  # (b, L) which keys are real
    block: int


def plan_branches(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    selected: Route,
    window: Route,
    pooled: tuple[Tensor, Tensor, Tensor],
    real: Tensor,
) -> Branches:
    """The node's inputs besides q, k, v and the gates: both routes' tiles (with the node's
    scratch) and pooled = (block means of the keys, of the values, which blocks are real)."""
    means, values, has = pooled
    tiles = [plan_tiles(r, real, q, k, SCRATCH_BYTES) for r in (selected, window)]
    return Branches(*tiles, means.to(k.dtype), values.to(v.dtype), has, real, selected.block)


class MixedNSA(Function):
    """The gated sum of NSA's branches; see the module docstring."""

    @staticmethod
    def forward(ctx, q, k, v, g_cmp, g_slc, g_swa, branches, backward_follows):  # type: ignore[override]
        scale = q.shape[-1] ** -0.5
        wide = compute_dtype(q.dtype)
        out = q.new_empty(*q.shape[:3], v.shape[-1], dtype=wide)
        positions = torch.arange(q.shape[2], device=q.device)
        pooled = branches.pooled_k, branches.pooled_v, branches.has
        for s, e in query_spans(q, branches.has):
            part = compressed_part(q[:, :, s:e], *pooled, positions[s:e], branches.block)
            torch.mul(part, g_cmp[:, :, s:e, None], out=out[:, :, s:e])
        # the branch outputs, kept for a backward to follow and dropped by it once it has their
        # row sums (remade there when not kept)
        keep = backward_follows and not hooks_saving()
        outputs, lses = [], []
        for tiles, gate in ((branches.selected, g_slc), (branches.window, g_swa)):
            o, lse = tiled_forward(q, k, v, tiles, scale)
            out.addcmul_(o, gate.to(wide).unsqueeze(-1))
            if keep:
                outputs.append(o)
            lses.append(lse)
            del o
        ctx.save_for_backward(q, k, v, g_cmp, g_slc, g_swa, *lses)
        ctx.outputs = outputs if keep else None
        ctx.branches, ctx.scale = branches, scale
        return out.to(torch.promote_types(q.dtype, g_slc.dtype))  # as the gated sum's dtype

    @staticmethod
    @hand_written_backward
    def backward(ctx, g):  # type: ignore[override]
        q, k, v, g_cmp, g_slc, g_swa, lse_slc, lse_swa = ctx.saved_tensors
        br, scale = ctx.branches, ctx.scale
        wide = lse_slc.dtype
        routed = ((br.selected, lse_slc, g_slc), (br.window, lse_swa, g_swa))
        outputs = ctx.outputs
        if outputs is None:  # not kept, or a second backward through a retained graph
            outputs = [tiled_forward(q, k, v, tiles, scale)[0] for tiles, _, _ in routed]
        ctx.outputs = None
        # rowsum(dO * o): each gate's gradient
        sums = [torch.linalg.vecdot(g.to(wide), o) for o in outputs]
        del outputs
        grads = zero_grads(q, k, v, br.block)
        for (tiles, lse, gate), r in zip(routed, sums, strict=True):
            tiled_backward(g, q, k, v, lse, gate.to(wide) * r, tiles, scale, grads, gate)
        grad_q, grad_k, grad_v = grads
        r_cmp = _compressed_backward(g, q, g_cmp, br, grad_q, grad_k, grad_v)
        grad_q = grad_q.view(q.shape).to(q.dtype)
        grad_k, grad_v = from_blocks(grad_k, k), from_blocks(grad_v, v)
        gate_grads = (r.to(gate.dtype) for r, gate in zip((r_cmp, *sums), (g_cmp, g_slc, g_swa)))
        return grad_q, grad_k, grad_v, *gate_grads, None, None


def _compressed_backward(
    g: Tensor, q: Tensor, gate: Tensor, br: Branches, grad_q: Tensor, grad_k: Tensor, grad_v: Tensor
) -> Tensor:
    """Add the compressed branch's gradients (recomputed a segment of queries at a time) into
    grad_q (b h t, d) and, through the block means, grad_k and grad_v (`as_blocks` rows); return
    its rowsum(dO * o_cmp), (b, h, t)."""
    wide = grad_q.dtype
    b, h, t, d = q.shape
    keys, values = (x.detach().requires_grad_() for x in (br.pooled_k, br.pooled_v))
    grad_keys = torch.zeros_like(keys, dtype=wide)
    grad_values = torch.zeros_like(values, dtype=wide)
    sums = q.new_empty(b, h, t, dtype=wide)
    positions = torch.arange(t, device=q.device)
    for s, e in query_spans(q, br.has):
        with torch.enable_grad():
            part_q = q[:, :, s:e].detach().requires_grad_()
            o = compressed_part(part_q, keys, values, br.has, positions[s:e], br.block)
        outer = g[:, :, s:e]
        sums[:, :, s:e] = torch.linalg.vecdot(outer.to(wide), o.detach().to(wide))
        dq, dk, dv = torch.autograd.grad(o, (part_q, keys, values), outer * gate[:, :, s:e, None])
        grad_q.view(b, h, t, d)[:, :, s:e] += dq
        grad_keys += dk
        grad_values += dv
    nb = br.has.shape[1]
    for acc, grad in ((grad_k, grad_keys), (grad_v, grad_values)):
        add_block_means_grad(acc.view(b, grad.shape[1], nb, br.block, -1), grad, br.real, br.block)
    return sums
