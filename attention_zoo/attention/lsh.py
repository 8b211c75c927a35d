"""Reformer LSH attention (Kitaev, Kaiser, Levskaya 2020), multi-round, exactly causal by default.

Angular LSH (Andoni et al. 2015) hashes each shared query/key into a bucket; positions are sorted by
(bucket, position) per round, the sorted sequence is cut into chunks, and each chunk attends to
itself and its neighbour chunks, only to keys of the same bucket. Rounds are combined by their
log-sum-exp weights. Causal: each query sees, within its bucket, itself and at most
chunk_length * num_chunks_before sorted predecessors -- a window no future token can shift (the
Hugging Face chunk-aligned window, kept as `hf_chunking=True`, leaks the future).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.autograd import Function

from ..errors import OptionError
from .base import AttentionCore, mask_value, self_mask_value
from .chunked import (
    Windows,
    Workspace,
    check_chunking,
    check_int,
    flash_backward_offset,
    flash_window_forward,
    math_attention,
    padded_length,
    resolve_kernel,
)
from .shared_qk import unit_keys
from .spec import Capabilities, register_attention

Buckets = int | tuple[int, int]
_EPS = 1e-6  # as shared_qk.unit_keys


@dataclass(frozen=True, kw_only=True)
class LSHConfig:
    """Options of LSH attention (names as Hugging Face's ReformerConfig where they exist)."""

    num_hashes: int = 1  # hash rounds, combined by log-sum-exp weights
    num_buckets: Buckets | None = (
        None  # int, factorised pair (a, b) -> a*b buckets, None = automatic
    )
    chunk_length: int = 64  # positions per chunk of the sorted sequence
    num_chunks_before: int = (
        1  # previous chunks attended (causal: the look-back, in positions x chunk)
    )
    num_chunks_after: int = 0  # following chunks attended (ignored when causal)
    seed: int | None = None  # seeds the random rotations; None draws them from torch's global RNG
    hf_chunking: bool = (
        False  # causal only: HF's chunk-aligned window (leaks the future; for comparison)
    )
    kernel: str = "auto"  # auto (flash on cpu/meta, else math), flash, math
    # hash rounds per fused forward pass; None = all at once (the backward always takes one)
    rounds_per_pass: int | None = None

    def __post_init__(self) -> None:
        check_chunking(
            "lsh", self.chunk_length, self.num_chunks_before, self.num_chunks_after, self.kernel
        )
        check_int("num_hashes", self.num_hashes, minimum=1, backend="lsh")
        if self.rounds_per_pass is not None:
            check_int("rounds_per_pass", self.rounds_per_pass, minimum=1, backend="lsh")
        if self.seed is not None:
            check_int("seed", self.seed, minimum=0, backend="lsh")
        if not isinstance(self.hf_chunking, bool):
            raise OptionError(f"lsh option hf_chunking must be a bool, got {self.hf_chunking!r}")
        object.__setattr__(self, "num_buckets", validate_buckets(self.num_buckets))


def validate_buckets(value: object) -> Buckets | None:
    """None, a positive int (even unless 1) or a pair of positive even ints; lists become tuples."""
    what = (
        "lsh num_buckets must be None (automatic), a positive even int (or 1), or a pair (a, b) of "
        "positive even ints giving a*b buckets"
    )
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1 or (value > 1 and value % 2):
            raise OptionError(f"{what}; got {value!r}" + (" (odd)" if value > 1 else ""))
        return value
    if isinstance(value, (tuple, list)):
        ok = len(value) == 2 and all(
            isinstance(f, int) and not isinstance(f, bool) and f >= 2 and f % 2 == 0 for f in value
        )
        if not ok:
            raise OptionError(f"{what}; got the factorised value {value!r}")
        return (int(value[0]), int(value[1]))
    raise OptionError(f"{what}; got {type(value).__name__} {value!r}")


def auto_buckets(npad: int, chunk: int) -> Buckets:
    """HF's rule on the padded length: ~2 * npad / chunk rounded down to a power of two, factorised
    into two powers of two when above 2 * max(sqrt(npad / chunk), chunk) (keeps rotations small)."""
    p = (2 * (npad // chunk)).bit_length() - 1
    limit = 2 * max(int((npad // chunk) ** 0.5), chunk)
    if 2**p > limit:
        return (2 ** (p // 2), 2 ** (p - p // 2))
    return 2**p


def total_buckets(nb: Buckets) -> int:
    return nb if isinstance(nb, int) else nb[0] * nb[1]


@register_attention(
    "lsh",
    config=LSHConfig,
    caps=Capabilities(shared_qk=True, exact=False, deterministic=False),
)
class LSHAttention(AttentionCore):
    """Multi-round LSH attention on shared QK; O(n * hashes * chunk) memory, exactly causal."""

    def buckets_for(self, n: int) -> Buckets:
        """The bucket count used at sequence length n (automatic when num_buckets is None)."""
        cfg = self.cfg
        npad = padded_length(n, cfg.chunk_length)
        return (
            cfg.num_buckets if cfg.num_buckets is not None else auto_buckets(npad, cfg.chunk_length)
        )

    def rotations(
        self, heads: int, d: int, nb: Buckets, device: torch.device, dtype: torch.dtype
    ) -> Tensor:
        """Random rotations (h, d, r, k): global RNG unless seeded (RNG replay reproduces them)."""
        k = nb // 2 if isinstance(nb, int) else (nb[0] + nb[1]) // 2
        shape = (heads, d, self.cfg.num_hashes, k)
        gen = None
        if self.cfg.seed is not None and device.type != "meta":
            gen = torch.Generator(device=device).manual_seed(self.cfg.seed)
        return torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)

    @torch.no_grad()
    def hash(self, qk: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """Buckets (b, h, r, n) of shared query/keys (b, h, n, d); padding gets the extra bucket."""
        return self._hash(qk, qk.shape[2], key_padding_mask)

    def _hash(self, qk: Tensor, n: int, key_padding_mask: Tensor | None) -> Tensor:
        """Buckets (b, h, r, len) of qk (b, h, len, d) whose first n positions are real."""
        b, h, length, d = qk.shape
        nb = self.buckets_for(n)
        r = self.cfg.num_hashes
        if nb == 1:
            buckets = qk.new_zeros((b, h, r, length), dtype=torch.long)
        else:
            rot = self.rotations(h, d, nb, qk.device, qk.dtype)
            buckets = torch.cat(
                [
                    _hash_rounds(qk.detach(), rot[:, :, s:e], nb)
                    for s, e in _groups(r, self.cfg.rounds_per_pass)
                ],
                dim=2,
            )
        real = torch.arange(length, device=qk.device) < n
        if key_padding_mask is not None:
            real = (
                real
                & torch.nn.functional.pad(key_padding_mask, (0, length - n), value=False)[
                    :, None, None
                ]
            )
        return torch.where(real, buckets, total_buckets(nb))  # padding: one extra, last bucket

    def attend(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        _b, _h, n, _d = q.shape
        cfg = self.cfg
        c = cfg.chunk_length
        npad = padded_length(n, c)
        if npad != n:  # pad to whole chunks; padding hashes to the extra bucket and sorts last
            shared = k is q
            q, k, v = (torch.nn.functional.pad(t, (0, 0, 0, npad - n)) for t in (q, k, v))
            k = q if shared else k
        with torch.no_grad():
            perm, sorted_buckets = _sort_by_bucket(self._hash(k, n, key_padding_mask))
        plan = _Plan(
            chunk=c,
            before=cfg.num_chunks_before,
            after=0 if self.causal else cfg.num_chunks_after,
            causal=self.causal,
            hf=cfg.hf_chunking,
            groups=_groups(cfg.num_hashes, cfg.rounds_per_pass),
            perm=perm,
            sorted_buckets=sorted_buckets,
        )
        if resolve_kernel(cfg.kernel, q.device, q.dtype) == "flash":
            # shared QK goes in once (k=None): one tensor as two inputs is an autograd edge case
            out = _LSHFlash.apply(q, None if k is q else k, v, plan)
        else:
            out = _lsh_math(q, k, v, plan)
        return out[:, :, :n]


def _sort_by_bucket(buckets: Tensor) -> tuple[Tensor, Tensor]:
    """buckets (b, h, r, n) -> (perm, sorted buckets): order by (bucket, position) per round.

    Sorted buckets are int32: they are only compared, and every byte here is live while the
    fused kernel runs."""
    npad = buckets.shape[-1]
    keys = buckets.mul_(npad).add_(torch.arange(npad, device=buckets.device))
    sorted_keys, perm = torch.sort(keys, dim=-1)
    del keys
    return perm, torch.div(sorted_keys, npad, rounding_mode="floor").to(torch.int32)


def _groups(r: int, per_pass: int | None) -> list[tuple[int, int]]:
    step = r if per_pass is None else per_pass
    return [(s, min(s + step, r)) for s in range(0, r, step)]


def _argmax_pm(x: Tensor) -> Tensor:
    """argmax over [x, -x] along the last dim without materialising the concatenation."""
    mx, imx = x.max(dim=-1)
    mn, imn = x.min(dim=-1)
    return torch.where(mx >= -mn, imx, imn + x.shape[-1])


def _hash_rounds(x: Tensor, rot: Tensor, nb: Buckets) -> Tensor:
    """x (b, h, n, d), rot (h, d, g, k) -> buckets (b, h, g, n): argmax([xR; -xR]) per round."""
    h, d, g, k = rot.shape
    rotated = torch.matmul(x, rot.reshape(h, d, g * k)).unflatten(-1, (g, k))  # (b, h, n, g, k)
    if isinstance(nb, int):
        buckets = _argmax_pm(rotated)
    else:  # factorised: two independent hashes a and b combine into a * b buckets
        a = nb[0] // 2
        buckets = _argmax_pm(rotated[..., :a]) + nb[0] * _argmax_pm(rotated[..., a:])
    return buckets.transpose(-1, -2)


@dataclass(frozen=True)
class _Plan:
    """Everything about one forward's sorting and windows, reused by backward."""

    chunk: int
    before: int
    after: int
    causal: bool
    hf: bool
    groups: list[tuple[int, int]]
    perm: Tensor  # (b, h, r, npad): sorted index -> position
    sorted_buckets: Tensor  # (b, h, r, npad)

    def windows(self, rows: int, npad: int, d: int) -> Windows:
        return Windows(
            chunk=self.chunk,
            before=self.before,
            after=self.after,
            length=rows * npad,
            to_heads=lambda x: x.unsqueeze(1),
        )

    def masks(
        self, s: int, e: int, win: Windows, dtype: torch.dtype, ws: Workspace | None = None
    ) -> _BucketMasks:
        """Additive masks for rounds s:e in sorted order (see `_BucketMasks`)."""
        sb = self.sorted_buckets[:, :, s:e]
        rows, npad = sb.shape[0] * sb.shape[1] * sb.shape[2], sb.shape[-1]
        return _BucketMasks(self, win, sb.reshape(rows, npad), dtype, ws)

    def regrid(self, block: int) -> _Plan:
        """The same attention pattern with query blocks of `block` positions (exact causal only).

        Exact causal windows slide with the query ([p - chunk * before, p] in sorted order), so
        blocks of `block` queries with `chunk * before / block` previous blocks cover them, and
        the masks keep the same bound. Smaller query blocks shrink the window each block scans
        (block + chunk * before keys instead of (before + 1) * chunk), and with it the float mask
        the fused kernel needs: at chunk 64, one before, 16-query blocks scan 80 keys, not 128.
        """
        if not self.causal or self.hf or block == self.chunk:
            return self
        if self.chunk % block:
            raise ValueError(f"query block {block} does not divide chunk {self.chunk}")
        return dataclasses.replace(
            self, chunk=block, before=self.before * (self.chunk // block), after=0
        )

    def forward_block(self) -> int:
        """Query block of the fused forward: a quarter chunk (>= 8) when the pattern allows."""
        if not self.causal or self.hf:
            return self.chunk
        block = self.chunk // 4
        return block if block >= 8 and self.chunk % 4 == 0 else self.chunk


class _BucketMasks:
    """Additive masks of LSH windows, per window offset (rows * chunks, 1, c, c) or whole (.., W).

    Keys of another bucket are masked (a missing neighbour chunk carries bucket -1); causal:
    exact keeps sorted offsets -before*c <= key - query <= 0, HF-style only key <= query (both
    within the bucket, where sorted order is position order). Self is masked here and added back
    as its own partial (see `_with_self`). With a workspace, every per-offset mask is written into
    the same buffer (only for kernels that are done with the previous one).
    """

    def __init__(
        self, plan: _Plan, win: Windows, sb: Tensor, dtype: torch.dtype, ws: Workspace | None
    ) -> None:
        rows, npad = sb.shape
        self.plan, self.win, self.dtype, self.ws = plan, win, dtype, ws
        self.keys = torch.nn.functional.pad(sb, (win.front, win.back), value=-1)
        self.queries = sb.view(rows, npad // win.chunk, win.chunk, 1)
        self.length = npad

    def _fill(self, keys: Tensor, delta: Tensor, out: Tensor | None, name: str) -> Tensor:
        """where(same bucket, position pattern, masked) for keys (rows, chunks, K), delta (c, K)."""
        plan = self.plan
        mv = torch.tensor(mask_value(self.dtype), dtype=self.dtype, device=delta.device)
        bad = delta == 0
        if plan.causal:
            bad = bad | (delta > 0)
            if not plan.hf:
                bad = bad | (delta < -self.win.front)
        pattern = torch.zeros(delta.shape, dtype=self.dtype, device=delta.device).masked_fill(
            bad, mv
        )
        rows, chunks, c, width = (*self.queries.shape[:3], delta.shape[1])
        if out is None:
            full = (rows * chunks, 1, c, width)
            out = pattern.new_empty(full) if self.ws is None else self.ws.get(name, full, pattern)
        torch.where(
            self.queries == keys.unsqueeze(2), pattern, mv, out=out.view(rows, chunks, c, width)
        )
        return out

    def __call__(self, o: int, out: Tensor | None = None) -> Tensor:
        """Offset o's block: keys of the chunk `o - before` chunks from the query's."""
        c = self.win.chunk
        t = torch.arange(c, device=self.keys.device)
        keys = self.keys[:, o * c : o * c + self.length].view(*self.queries.shape[:2], c)
        return self._fill(keys, (o - self.win.before) * c + t[None, :] - t[:, None], out, "mask")

    def window(self) -> Tensor:
        """Whole windows (rows * chunks, 1, c, W), for the fused forward's single call."""
        c, width = self.win.chunk, self.win.width
        device = self.keys.device
        keys = self.keys.unfold(1, width, c)  # (rows, chunks, W): overlapping views, no copy
        w, t = torch.arange(width, device=device), torch.arange(c, device=device)
        return self._fill(keys, w[None, :] - self.win.front - t[:, None], None, "window_mask")


def _gather_rows(x: Tensor, perm: Tensor) -> Tensor:
    """x (b, h, n, d) gathered by perm (b, h, g, n) -> (b, h, g * n, d), differentiably."""
    b, h, g, n = perm.shape
    return torch.gather(x, 2, perm.reshape(b, h, g * n, 1).expand(b, h, g * n, x.shape[-1]))


def _undo(perm: Tensor) -> Tensor:
    """Inverse permutations, offset per round so they index a (b, h, g * n) flat sorted sequence."""
    _b, _h, g, n = perm.shape
    undo = torch.empty_like(perm)
    undo.scatter_(-1, perm, torch.arange(n, device=perm.device).expand_as(perm))
    return undo + (torch.arange(g, device=perm.device) * n).view(1, 1, g, 1)


def _row_view(x: Tensor) -> tuple[Tensor, Tensor]:
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


class _Pass:
    """Index bookkeeping of one pass over hash rounds s:e (g rounds), all flat over (b, h, g, n)."""

    def __init__(self, plan: _Plan, s: int, e: int, shape: tuple[int, ...], ws: Workspace) -> None:
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
        return (_undo(self.perm).transpose(-1, -2) + offsets.view(b, h, 1, 1)).reshape(-1)

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
        """Rows of a (b, h, npad, d) tensor (see `_row_view`) in this pass's sorted order."""
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


class _LSHFlash(Function):
    """Sort, chunked fused-kernel attention over all rounds, unsort, combine; exact backward.

    Nothing round-sized is saved: backward re-sorts the inputs and rebuilds the masks, one hash
    round at a time (so its working set is one round's, whatever num_hashes is).
    """

    @staticmethod
    def forward(ctx, q, k, v, plan):  # type: ignore[override]
        k = q if k is None else k  # None: shared QK
        _b, _h, _npad, d = q.shape
        rk = torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + _EPS)  # unit keys = k * rk
        rows, shared, ws = (_row_view(q), _row_view(k), _row_view(v)), k is q, Workspace()
        fine = plan.regrid(plan.forward_block())
        out = lse = None
        for s, e in fine.groups:
            p = _Pass(fine, s, e, q.shape, ws)
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
        out, lse = _with_self(out, lse, v, plan.perm.shape[2])
        ctx.save_for_backward(q, k, v, rk, out, lse)
        ctx.plan, ctx.shared = plan, shared
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        q, k, v, rk, out, lse = ctx.saved_tensors
        plan = ctx.plan
        b, h, npad, d = q.shape
        rows, ws = (_row_view(q), _row_view(k), _row_view(v)), Workspace()
        grad_rows, out_rows = _row_view(grad), _row_view(out)
        # q, k (unit keys), v -> flat (b * h * npad, d) in position order, summed over rounds
        dq, dkeys, dv = (q.new_zeros((b * h * npad, d)) for _ in range(3))
        for r in range(plan.perm.shape[2]):  # one round at a time: backward only
            p = _Pass(plan, r, r + 1, q.shape, ws)
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
        dv += _self_weight(lse, q.dtype, plan.perm.shape[2]).unsqueeze(-1).to(dv.dtype) * grad
        # keys = k * rk with rk = (|k|^2 + eps)^-1/2: dk = rk * dkeys - rk^3 (k . dkeys) k
        dk = rk * dkeys - rk.pow(3) * (k * dkeys).sum(-1, keepdim=True) * k
        if ctx.shared:  # q was also the keys
            return dq.add_(dk), None, dv, None
        return dq, dk, dv, None


def _lsh_math(q: Tensor, k: Tensor, v: Tensor, plan: _Plan) -> Tensor:
    """The same computation with materialised blocks and plain autograd (CUDA, checks)."""
    b, h, npad, d = q.shape
    keys = unit_keys(k, _EPS)
    outs, lses = [], []
    for s, e in plan.groups:
        perm = plan.perm[:, :, s:e]
        g = e - s
        win = plan.windows(b * h * g, npad, d)
        q4 = win.to_blocks(_gather_rows(q, perm).reshape(-1, d))
        pad = (0, 0, win.front, win.back)
        k_long = torch.nn.functional.pad(_gather_rows(keys, perm).reshape(-1, d), pad)
        v_long = torch.nn.functional.pad(_gather_rows(v, perm).reshape(-1, d), pad)
        out4, lse4 = math_attention(q4, k_long, v_long, win, plan.masks(s, e, win, q.dtype), 1.0)
        undo = _undo(perm).view(b, h, g * npad)
        outs.append(
            torch.gather(
                out4.reshape(b, h, g * npad, d), 2, undo[..., None].expand(-1, -1, -1, d)
            ).view(b, h, g, npad, d)
        )
        lses.append(torch.gather(lse4.reshape(b, h, g * npad), 2, undo).view(b, h, g, npad))
    o_r, lse_r = torch.cat(outs, 2), torch.cat(lses, 2)
    lse = torch.logsumexp(lse_r, dim=2)
    out = (o_r * torch.exp(lse_r - lse.unsqueeze(2)).unsqueeze(-1)).sum(2)  # round weights
    return _with_self(out, lse, v, plan.perm.shape[2])[0]


def _self_lse(dtype: torch.dtype, rounds: int) -> float:
    """Log-weight of a query's own key: once per round, its score replaced by the self penalty."""
    return self_mask_value(dtype) + math.log(rounds)


def _self_weight(lse: Tensor, dtype: torch.dtype, rounds: int) -> Tensor:
    return torch.exp(_self_lse(dtype, rounds) - lse)


def _with_self(out: Tensor, lse: Tensor, v: Tensor, rounds: int) -> tuple[Tensor, Tensor]:
    """Fold the self partial (output v, fixed score) into a combined (out, lse).

    The kernels mask self entirely; adding it back here with its exact replaced score keeps the
    1e5-sized penalty out of the kernels' float arithmetic (where one rounding step is ~0.01) while
    matching the Reformer rule: self counts only when nothing else is allowed.
    """
    total = torch.logaddexp(lse, torch.full_like(lse, _self_lse(v.dtype, rounds)))
    keep = torch.exp(lse - total).unsqueeze(-1).to(out.dtype)
    own = _self_weight(total, v.dtype, rounds).unsqueeze(-1).to(out.dtype)
    return out * keep + v * own, total
