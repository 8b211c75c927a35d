"""FlexAttention for any core with a fixed pattern: a softmax under its mask_mod and the key
padding (the conformance suite's definition: scores q k^T / sqrt(d)), block lists from its
structure; the `flex` implementation of local, sliding-window, bigbird and a plugin's pattern."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ...dispatch import Call, Implementation
from ..flex import flex_dtype, flex_environment, run_flex


def pattern_flex(
    core: Any, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None
) -> Tensor:
    """The core's fixed pattern through FlexAttention: a softmax under its mask_mod and the key
    padding, a query with no key to see gets zeros."""
    n, d = q.shape[-2:]
    block_mask = core.tile_masks(n, q.device).for_call(key_padding_mask)
    return run_flex(q, k, v, block_mask, scale=d**-0.5)[0]


def _has_pattern(core: Any, call: Call) -> str | None:
    caps = core.capabilities
    if caps is not None and not caps.fixed_pattern:
        return "computes no fixed pattern with these options (capabilities: not fixed_pattern)"
    if core.mask_mod(1) is None:
        return "computes no fixed pattern with these options (mask_mod is None)"
    return None


FLEX = Implementation(
    name="flex",
    summary="FlexAttention under the pattern's mask_mod, block lists from its structure "
    "(compiled on CUDA; PyTorch's dense eager version elsewhere)",
    run=pattern_flex,
    devices=frozenset({"cpu", "cuda"}),
    grouped=True,
    environment=flex_environment,
    checks=(_has_pattern, flex_dtype),
)
