"""Index bookkeeping shared by the round-sorted kernels: rows of (b, h, n, d) tensors in any
memory layout, permutations over hash rounds and their inverses, and one pass over a range of
sorted slots (whole rounds, or a slice of one): sort inputs into its order, fold its results back
in position order."""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from ..chunked import RowWindows, Workspace


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


# Scratch of one pass, in bytes of one (rows, d) input: the fused forward's sorted inputs, masks
# and outputs (about 8 of them) sit beside only the running output; the backward's (about 11)
# beside the output, its gradient and the three input gradients. Constant sizes keep the working
# set flat in the sequence length (at 16k, 4 heads x 64: 8 and 32 passes of 4 hashes) while a short
# sequence still runs all its rounds in one forward pass and one round per backward pass.
FORWARD_PASS_BYTES = 4 << 20
BACKWARD_PASS_BYTES = 1 << 20


def pass_slots(
    rows: int, rounds: int, npad: int, row_bytes: int, budget: int, chunk: int, cap: int | None
) -> list[tuple[int, int]]:
    """Slot ranges [start, stop) of the concatenated rounds (R * npad per (b, h) row) that the
    passes take: whole rounds (at most `cap`) while they fit the budget, else whole chunks of
    one round (a pass never mixes part of a round with another round)."""
    fit = budget // (rows * row_bytes)
    per_pass = min(fit // npad, cap or rounds)
    if per_pass >= 1:
        return [(s * npad, min(s + per_pass, rounds) * npad) for s in range(0, rounds, per_pass)]
    step = max(chunk, fit // chunk * chunk)
    return [
        (r * npad + a, r * npad + min(a + step, npad))
        for r in range(rounds)
        for a in range(0, npad, step)
    ]


class SlotPlan:
    """What the round-sorted plans share: passes over slot ranges of their concatenated rounds.

    A subclass (a frozen dataclass) has chunk, before, after, groups and perm (b, h, R, npad),
    and says how slots beyond a row's ends map (`key_slots`) and how a pass is masked
    (`pass_masks`)."""

    def make_pass(self, start: int, stop: int, ws: Workspace) -> SlotPass:
        return SlotPass(self, start, stop, ws)

    def forward_plan(self):
        return self

    def windows(self, rows: int, slots: int) -> RowWindows:
        return RowWindows(
            chunk=self.chunk,
            before=self.before,
            after=self.after,
            length=rows * slots,
            to_heads=lambda x: x,
            rows=rows,
        )

    @property
    def rounds_cap(self) -> int:
        """Most rounds one forward pass may take (the plan's round groups)."""
        return max(e - s for s, e in self.groups)

    def passes(self, like: Tensor, budget: int, cap: int | None) -> list[tuple[int, int]]:
        """The slot ranges of passes whose inputs like `like` (b, h, npad, d) fit `budget`."""
        b, h, rounds, npad = self.perm.shape
        row_bytes = like.shape[-1] * like.element_size()
        return pass_slots(b * h, rounds, npad, row_bytes, budget, self.chunk, cap)


class SlotPass:
    """Slots [start, stop) of every (b, h) row's concatenation of sorted rounds, all rows at once.

    Queries are the pass's slots; keys and values sit in per-row long buffers holding the slots
    from `front` before to `back` after (the plan maps slots beyond the ends: wrapped around for
    HF's circular windows, clamped and masked for exact LSH). Sorting is one index_select of
    rows; only this pass's slots are ever gathered."""

    def __init__(self, plan, start: int, stop: int, ws: Workspace) -> None:
        b, h, rounds, npad = plan.perm.shape
        rows, device = b * h, plan.perm.device
        self.plan, self.start, self.stop, self.ws = plan, start, stop, ws
        self.win = plan.windows(rows, stop - start)
        concat = plan.perm.reshape(rows, rounds * npad)
        offsets = (torch.arange(rows, device=device) * npad).view(-1, 1)
        self.q_pos = concat[:, start:stop]  # (rows, slots): positions within the row
        self.positions = (self.q_pos + offsets).reshape(-1)  # flat (b, h, npad) positions
        self.long_slots = torch.arange(start - self.win.front, stop + self.win.back, device=device)
        self.long_pos = concat[:, plan.key_slots(self.long_slots)]
        self.long_flat = (self.long_pos + offsets).reshape(-1)

    @property
    def whole_rounds(self) -> bool:
        npad = self.plan.perm.shape[-1]
        return self.start % npad == 0 and self.stop % npad == 0

    def masks(self, dtype: torch.dtype):
        return self.plan.pass_masks(self, dtype)

    def key_index(self, o: int) -> Tensor:
        """Flat positions of the keys at window offset o, slot by slot."""
        win = self.win
        long = self.long_flat.view(win.rows, win.long_length)
        return long.narrow(1, o * win.chunk, win.row_length).reshape(-1)

    def sort(
        self, rows: tuple[Tensor, Tensor], name: str | None = None, out: Tensor | None = None
    ) -> Tensor:
        """Rows of a (b, h, npad, d) tensor (see `row_view`) in this pass's slot order."""
        view, index = rows
        if name is not None:
            out = self.ws.get(name, (self.win.length, view.shape[-1]), view)
        return torch.index_select(view, 0, index.reshape(-1)[self.positions], out=out)

    def inputs(
        self, q_rows, k_rows, rk: Tensor | None, v_rows, shared: bool
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Queries in slot order (flat); keys (times rk) and values in long buffers.

        Shared QK: a long buffer's middle is the pass's own slots, so the keys there are the
        sorted queries (times rk) and only the neighbour chunks at the ends are gathered."""
        d = q_rows[0].shape[-1]
        win = self.win
        q_flat = self.sort(q_rows, "q")
        k_long = self.ws.get("k", (win.rows, win.long_length, d), q_flat)
        if shared:
            mid = k_long.narrow(1, win.front, win.row_length)
            sorted_q = q_flat.view(win.rows, win.row_length, d)
            mid.copy_(sorted_q)  # (an out= of a strided view: not under torch.compile)
            if rk is not None:
                mid.mul_(rk.view(-1)[self.positions].view(win.rows, win.row_length, 1))
            long_flat = self.long_flat.view(win.rows, win.long_length)
            masked = self.plan.margins_masked(self)  # then any finite keys do: zeros
            for first, count in ((0, win.front), (win.front + win.row_length, win.back)):
                if count and masked:
                    k_long.narrow(1, first, count).zero_()
                elif count:
                    index = long_flat.narrow(1, first, count).reshape(-1)
                    ends = k_rows[0].index_select(0, k_rows[1].reshape(-1)[index])
                    if rk is not None:
                        ends.mul_(rk.view(-1)[index].unsqueeze(-1))
                    k_long.narrow(1, first, count).copy_(ends.view(win.rows, count, d))
        else:
            k_view, k_index = k_rows
            flat = k_long.view(-1, d)
            torch.index_select(k_view, 0, k_index.reshape(-1)[self.long_flat], out=flat)
            if rk is not None:
                flat.mul_(rk.view(-1)[self.long_flat].unsqueeze(-1))
        v_view, v_index = v_rows
        v_long = self.ws.get("v", (win.rows * win.long_length, d), q_flat)
        torch.index_select(v_view, 0, v_index.reshape(-1)[self.long_flat], out=v_long)
        return q_flat, k_long.view(-1, d), v_long

    def combine(
        self, out_sorted: Tensor, lse_sorted: Tensor, like: Tensor
    ) -> tuple[Tensor, Tensor]:
        """A pass of whole rounds combined in position order: (out (b*h*npad, d), lse (b*h*npad)).

        out_sorted (slots, d) is weighted in place by exp(lse_round - lse_combined) and
        scattered back with index_add (no round-sized unsorted copy)."""
        b, h, npad, d = like.shape
        g = (self.stop - self.start) // npad
        perm = self.plan.perm[:, :, self.start // npad : self.stop // npad]
        offsets = torch.arange(b * h, device=perm.device) * (g * npad)
        unsort = (undo_perm(perm).transpose(-1, -2) + offsets.view(b, h, 1, 1)).reshape(-1)
        lse_g = torch.logsumexp(lse_sorted[unsort].view(b * h * npad, g), dim=-1)
        w = torch.exp(lse_sorted - lse_g[self.positions]).unsqueeze(-1)
        out = like.new_zeros((b * h * npad, d))
        out.index_add_(0, self.positions, out_sorted.mul_(w.to(out_sorted.dtype)))
        return out, lse_g

    def merge(self, out: Tensor, lse: Tensor, out_sorted: Tensor, lse_sorted: Tensor) -> None:
        """Fold part of one round (each position at most once) into the running (out, lse) in
        place, by log-sum-exp: only this pass's rows are read and written."""
        old = lse.index_select(0, self.positions)
        new = torch.logaddexp(old, lse_sorted)
        rows = out.index_select(0, self.positions)
        rows.mul_(torch.exp(old - new).unsqueeze(-1).to(rows.dtype))
        rows.addcmul_(out_sorted, torch.exp(lse_sorted - new).unsqueeze(-1).to(rows.dtype))
        out.index_copy_(0, self.positions, rows)
        lse.index_copy_(0, self.positions, new)
