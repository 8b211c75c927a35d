"""The contract every attention core keeps: (b, h, n, d) in, same shape out, checked input."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import OptionError, ShapeError

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


SEMANTICS = ("exact", "hf")

# A fixed attention pattern written once (attention-gym's mask_mod): (query positions, key
# positions), broadcasting int tensors -> bool, True where the query may see the key. Kernels
# build their block masks from it, `AttentionCore.pattern` the dense (n, n) mask tests check.
MaskMod = Callable[[Tensor, Tensor], Tensor]


def check_dropout(backend: str, p: object) -> None:
    """Raise OptionError unless p is an attention-probability dropout rate in [0, 1)."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < 1:
        raise OptionError(f"{backend} option dropout must be a float in [0, 1), got {p!r}")


def check_semantics(backend: str, semantics: object) -> None:
    if semantics not in SEMANTICS:
        raise OptionError(
            f"{backend} semantics {semantics!r} is not one of: {', '.join(SEMANTICS)} "
            "(hf = as transformers' Reformer computes it)"
        )


def check_qkv(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> None:
    """Raise ShapeError unless q, k, v are (b, h, n, d) of one shape and the mask is (b, n) bool."""
    for label, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise ShapeError(f"{label} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ShapeError(
                f"{label} must have rank 4 (batch, heads, length, head_dim), "
                f"got shape {tuple(t.shape)}"
            )
    if not (q.shape == k.shape == v.shape):
        raise ShapeError(
            "q, k and v must have the same (batch, heads, length, head_dim) shape, got "
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise ShapeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.dtype.is_floating_point:
        raise ShapeError(
            f"q, k and v must have a floating-point dtype (float32, float64, bfloat16, float16), "
            f"got {q.dtype}"
        )
    check_key_padding_mask(key_padding_mask, q.shape[0], q.shape[2])


def check_key_padding_mask(key_padding_mask: Tensor | None, b: int, n: int) -> None:
    """Raise ShapeError unless the mask is None or (b, n) bool."""
    if key_padding_mask is None:
        return
    if key_padding_mask.shape != (b, n) or key_padding_mask.dtype != torch.bool:
        raise ShapeError(
            f"key_padding_mask must be a bool tensor of shape (batch, length) = ({b}, {n}) "
            f"with True for real tokens, "
            f"got {key_padding_mask.dtype} {tuple(key_padding_mask.shape)}"
        )


@dataclass(frozen=True)
class BlockWeights:
    """The attention block's linear maps, for a core that folds them into its own products:
    q, k, v = x w_q^T, x w_k^T, x w_v^T split into heads, output = heads merged @ w_out^T."""

    w_q: Tensor  # (heads * head_size, hidden)
    w_k: Tensor
    w_v: Tensor
    w_out: Tensor  # (hidden, heads * head_size)
    heads: int

    def per_head(self, w: Tensor) -> Tensor:
        """An input map (heads * head_size, hidden) as (heads, head_size, hidden)."""
        return w.view(self.heads, -1, w.shape[-1])


class AttentionCore(nn.Module):
    """Base class of the built-in cores: validates input, then calls `attend`."""

    spec: Any  # set by @register_attention

    def __init__(self, cfg: Any, *, causal: bool = False) -> None:
        super().__init__()
        self.cfg = cfg
        self.causal = causal

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None = None
    ) -> Tensor:
        """(b, h, n, d) x3 -> (b, h, n, d); key_padding_mask (b, n) bool, True = real token."""
        check_qkv(q, k, v, key_padding_mask)
        return self.attend(q, k, v, key_padding_mask)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        raise NotImplementedError

    def attend_block(
        self, x: Tensor, weights: BlockWeights, key_padding_mask: Tensor | None
    ) -> Tensor | None:
        """The block's output (b, n, hidden) from its input x (b, n, hidden) where this core
        computes the same function with the block's linear maps folded into its own products
        (fewer FLOPs); None (the default): the block projects q, k, v and calls `forward`."""
        return None

    def mask_mod(self, n: int, device: torch.device | str = "cpu") -> MaskMod | None:
        """This core's fixed pattern at length n, causality included, before key padding; None
        when it has none (full attention, or a pattern that depends on the inputs)."""
        return None

    def pattern(self, n: int, device: torch.device | str = "cpu") -> Tensor | None:
        """(n, n) bool, True where query i may attend to key j; None without a fixed pattern.

        A backend whose capabilities say `fixed_pattern` equals a dense softmax under this mask
        (and the key padding mask) on every query that sees at least one key."""
        mod = self.mask_mod(n, device)
        if mod is None:
            return None
        i = torch.arange(n, device=device)
        return mod(i[:, None], i[None, :])

    @property
    def dropout_p(self) -> float:
        """Attention-probability dropout to apply now: the `dropout` option in training, else 0.

        Masks come from the global RNG, so a reversible or checkpointed recomputation that
        replays the RNG state (see rng.py) draws the same masks."""
        return float(getattr(self.cfg, "dropout", 0.0)) if self.training else 0.0

    def extra_repr(self) -> str:
        return f"causal={self.causal}, {self.cfg}"
