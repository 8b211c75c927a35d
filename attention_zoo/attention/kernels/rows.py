"""Index bookkeeping shared by the round-sorted kernels: rows of (b, h, n, d) tensors in any
memory layout, permutations over hash rounds and their inverses, and one pass over a few rounds
(sort inputs into its order, combine its results back in position order)."""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from .chunked import Windows, Workspace


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


class RoundPass:
    """One pass over rounds s:e (g rounds) of a (b, h, R, npad) permutation, flat over (b, h, g, n).

    Subclasses set `win` (the pass's window geometry) and say how inputs, masks and key indices
    are laid out."""

    win: Windows

    def __init__(self, perm: Tensor, s: int, e: int, ws: Workspace) -> None:
        b, h, _, npad = perm.shape
        self.perm = perm[:, :, s:e]  # (b, h, g, npad)
        self.g = e - s
        self.ws = ws
        flat = self.perm + (torch.arange(b * h, device=perm.device) * npad).view(b, h, 1, 1)
        self.positions = flat.reshape(-1)  # sorted slot -> flat (b, h, npad) position

    def unsort(self) -> Tensor:
        """Unsorted (b, h, npad, g) -> sorted slot, flat: gathers results back in position order."""
        b, h, _, npad = self.perm.shape
        offsets = torch.arange(b * h, device=self.perm.device) * (self.g * npad)
        return (undo_perm(self.perm).transpose(-1, -2) + offsets.view(b, h, 1, 1)).reshape(-1)

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
