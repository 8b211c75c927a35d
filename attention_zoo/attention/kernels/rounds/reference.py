"""The family's reference for exact LSH: given every round's sort (perm, sorted buckets), a dense
softmax per round over the keys its window allows, rounds merged by log-sum-exp, the self partial
last. Written from the rule, not from any kernel's layout; O(r n^2): for tests at small lengths."""

from __future__ import annotations

import torch
from torch import Tensor

from ..dense import dense_attention, unit_keys
from .lsh_plan import with_self


def lsh_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    perm: Tensor,
    sorted_buckets: Tensor,
    *,
    chunk: int,
    before: int,
    after: int,
    causal: bool,
) -> Tensor:
    """(b, h, npad, d) -> (b, h, npad, d). A query sees a key of its bucket (in the same round)
    other than itself: causal, one of the chunk * before sorted slots before it; bidirectional,
    in its sorted chunk, `before` chunks back or `after` ahead."""
    rounds, npad = perm.shape[2:]
    positions = torch.arange(npad, device=perm.device).expand_as(perm)
    slot = torch.empty_like(perm).scatter_(-1, perm, positions)
    bucket = torch.gather(sorted_buckets.long(), -1, slot)  # (b, h, r, npad) by position
    si, sj = slot[..., :, None], slot[..., None, :]
    allowed = (bucket[..., :, None] == bucket[..., None, :]) & (si != sj)
    if causal:
        allowed &= (sj < si) & (sj >= si - chunk * before)
    else:
        qc, kc = si // chunk, sj // chunk
        allowed &= (kc >= qc - before) & (kc <= qc + after)
    keys = unit_keys(k)
    out_r, lse_r = dense_attention(
        q[:, :, None], keys[:, :, None], v[:, :, None], allowed, scale=1.0, return_lse=True
    )  # (b, h, r, npad, d), (b, h, r, npad)
    lse_r = lse_r.masked_fill(~allowed.any(-1), float("-inf"))  # a round with no key: no weight
    total = torch.logsumexp(lse_r, dim=2)
    weights = torch.exp(lse_r - total.unsqueeze(2)).nan_to_num(0.0).unsqueeze(-1)
    return with_self((out_r * weights).sum(2), total, v, rounds)[0]
