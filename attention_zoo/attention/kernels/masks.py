"""Mask values and the pattern type every kernel shares."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

# Large negative scores instead of -inf: a row with every key masked stays finite
# (HF does the same).
_MASK_VALUE = {torch.float16: -1e4, torch.bfloat16: -1e9, torch.float32: -1e9, torch.float64: -1e9}
# A shared-QK query scores highest against itself; this penalty lets it attend to itself only when
# nothing else is allowed (Reformer paper, section 2; HF's self_mask_value).
_SELF_VALUE = {torch.float16: -1e3, torch.bfloat16: -1e5, torch.float32: -1e5, torch.float64: -1e5}


def mask_value(dtype: torch.dtype) -> float:
    return _MASK_VALUE.get(dtype, -1e9)


def self_mask_value(dtype: torch.dtype) -> float:
    return _SELF_VALUE.get(dtype, -1e5)


def real_positions(
    n: int, length: int, key_padding_mask: Tensor | None, device: torch.device | str
) -> Tensor:
    """(b | 1, length) bool: the real positions of n tokens padded to `length`, less those the
    key_padding_mask (b, n) calls padding."""
    real = (torch.arange(length, device=device) < n)[None]
    if key_padding_mask is not None:
        real = real & torch.nn.functional.pad(key_padding_mask, (0, length - n), value=False)
    return real


def additive_mask(ok: Tensor, dtype: torch.dtype, out: Tensor | None = None) -> Tensor:
    """0 where `ok`, the dtype's mask value elsewhere: a boolean mask as the fused kernels add it
    to their scores."""
    zero = torch.zeros((), dtype=dtype, device=ok.device)
    low = torch.full((), mask_value(dtype), dtype=dtype, device=ok.device)
    return torch.where(ok, zero, low, out=out)


def real_keys(key_padding_mask: Tensor | None, b: int, n: int, device: torch.device) -> Tensor:
    """(b, n) bool: the real keys (all, without a key padding mask)."""
    if key_padding_mask is None:
        return torch.ones(b, n, dtype=torch.bool, device=device)
    return key_padding_mask


def real_keys_mask(key_padding_mask: Tensor) -> Tensor:
    """(b, n) bool, True = real token -> (b, 1, 1, n): the keys a query may see, for every head
    and query."""
    return key_padding_mask[:, None, None, :]


# A fixed attention pattern written once (attention-gym's mask_mod): (query positions, key
# positions), broadcasting int tensors -> bool, True where the query may see the key. Kernels
# build their block masks from it, `AttentionCore.pattern` the dense (n, n) mask tests check.
MaskMod = Callable[[Tensor, Tensor], Tensor]
