"""LSH attention (exact semantics) through FlexAttention: every round's bucket-sorted positions side
by side in one sequence, one flex call over it, rounds merged by their log-sum-exp.

The block lists come from the chunk structure alone (a query tile's keys lie in its own and the
previous chunks of the sorted sequence: a few tiles per query tile, never an n x n mask) and are
built once per length; the mask_mod compares the slots' codes (bucket and round in one number)
and their sorted offsets, the same rule as `lsh_plan.BucketMasks`. A query's own key is left to
the self partial (`lsh_plan.with_self`), as in the other kernels, so outputs agree within
rounding.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor

from ..dense import unit_keys
from ..flex import BlockMask, FlexMaskMod, run_flex
from ..masks import mask_value
from .lsh_plan import with_self
from .rows import undo_perm


def sorted_codes(sorted_buckets: Tensor) -> Tensor:
    """(b, h, r n) int32: each sorted slot's bucket and round in one number (bucket r + round)."""
    b, h, rounds, npad = sorted_buckets.shape
    round_of = torch.arange(rounds, device=sorted_buckets.device, dtype=torch.int32)[:, None]
    return (sorted_buckets * rounds + round_of).reshape(b, h, rounds * npad)


def window_mod(codes: Tensor, chunk: int, before: int, after: int, causal: bool) -> FlexMaskMod:
    """The exact LSH window over sorted slots as a FlexAttention mask_mod: same code, not self;
    causal: at most chunk * before slots back (within a bucket, sorted order is position order);
    else the query's chunk, `before` chunks back and `after` ahead."""
    last = codes.shape[-1] - 1
    back = chunk * before

    def mod(b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        same = codes[b, h, i.clamp(max=last)] == codes[b, h, j.clamp(max=last)]
        if causal:
            near = (j < i) & (j >= i - back)
        else:
            qc, kc = i // chunk, j // chunk
            near = (kc >= qc - before) & (kc <= qc + after) & (j != i)
        return same & near

    return mod


def lsh_flex(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    perm: Tensor,
    sorted_buckets: Tensor,
    structure: BlockMask,
    *,
    chunk: int,
    before: int,
    after: int,
    causal: bool,
) -> Tensor:
    """(b, h, npad, d) queries, shared keys, values and the sort of every round (perm, sorted
    buckets (b, h, r, npad)) -> (b, h, npad, d). `structure`: the block mask of the sorted
    sequence's chunk windows (`flex.chunk_window_tiles`, every tile partial)."""
    b, h, rounds, npad = perm.shape
    d = q.shape[-1]
    slots = perm.reshape(b, h, rounds * npad, 1).expand(-1, -1, -1, d)
    qs, ks, vs = (torch.gather(t, 2, slots) for t in (q, unit_keys(k), v))
    block_mask = copy.copy(structure)  # the tile lists, this call's codes
    block_mask.mask_mod = window_mod(sorted_codes(sorted_buckets), chunk, before, after, causal)
    out, lse = run_flex(qs, ks, vs, block_mask, scale=1.0, lse=True)
    undo = undo_perm(perm).reshape(b, h, rounds * npad)  # each round's position -> its slot
    o_r = torch.gather(out, 2, undo[..., None].expand(-1, -1, -1, d)).view(b, h, rounds, npad, d)
    lse_r = torch.gather(lse, 2, undo).view(b, h, rounds, npad)
    lse_r = lse_r.clamp(min=mask_value(torch.float32))  # a round with no key: weight 0, no NaN
    total = torch.logsumexp(lse_r, dim=2)
    weights = torch.exp(lse_r - total.unsqueeze(2)).unsqueeze(-1).to(o_r.dtype)
    return with_self((o_r * weights).sum(2), total, v, rounds)[0]
