"""The family's reference: a dense softmax under the core's pattern (its `mask_mod` at the length)
and the key padding; a query with no key to see gets zeros, as the kernels give. O(n^2): for tests
at small lengths."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ..dense import dense_attention
from ..masks import real_keys_mask


def pattern_reference(
    core: Any, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None
) -> Tensor:
    """(b, h, n, d) x3 -> (b, h, n, d): softmax(q k^T / sqrt(d)) v under `core.pattern(n)`."""
    n, d = q.shape[-2:]
    allowed = core.pattern(n, q.device)[None, None]
    if key_padding_mask is not None:
        allowed = allowed & real_keys_mask(key_padding_mask)
    out = dense_attention(q, k, v, allowed, scale=d**-0.5)
    return out * allowed.any(-1, keepdim=True)
