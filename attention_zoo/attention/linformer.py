"""Linformer attention (Wang et al. 2020): keys and values projected along the sequence to
`proj_length` rows by learned matrices, then softmax attention over them; O(n * proj_length).

Bidirectional only (every projected row mixes all positions). The projections are parameters
(proj_length, max_length), sliced to the sequence length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..errors import InputError, OptionError
from .base import AttentionCore, check_dropout
from .kernels.chunked import check_int
from .kernels.linear_scan import compute_dtype
from .kernels.low_rank import ProjectedAttention, project
from .spec import Capabilities, register_attention


@dataclass(frozen=True, kw_only=True)
class LinformerConfig:
    """Options of Linformer attention."""

    proj_length: int = 256  # k: rows the keys and values are projected to
    max_length: int = 4096  # longest sequence the projections cover
    share_kv: bool = True  # one projection for keys and values (the paper's key-value sharing)
    dropout: float = 0.0  # attention-probability dropout over the projected keys, training only

    def __post_init__(self) -> None:
        check_int("proj_length", self.proj_length, minimum=1, backend="linformer")
        check_int("max_length", self.max_length, minimum=1, backend="linformer")
        if not isinstance(self.share_kv, bool):
            raise OptionError(
                f"linformer option share_kv must be True or False, got {self.share_kv!r}"
            )
        check_dropout("linformer", self.dropout)


def _projection(cfg: LinformerConfig) -> nn.Parameter:
    # uniform in +-1/sqrt(k), as the paper's reference code initialises E and F
    bound = 1 / math.sqrt(cfg.proj_length)
    return nn.Parameter(torch.empty(cfg.proj_length, cfg.max_length).uniform_(-bound, bound))


@register_attention(
    "linformer", config=LinformerConfig, caps=Capabilities(causal=False, exact=False)
)
class LinformerAttention(AttentionCore):
    """Low-rank attention over learned projections of keys and values; O(n * proj_length)."""

    def __init__(self, cfg: LinformerConfig, *, causal: bool = False) -> None:
        super().__init__(cfg, causal=causal)
        self.proj_k = _projection(cfg)
        self.proj_v = None if cfg.share_kv else _projection(cfg)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        n = q.shape[-2]
        if n > self.cfg.max_length:
            raise InputError(
                f"linformer got {n} positions, more than its max_length={self.cfg.max_length}; "
                f"build it with max_length >= {n}"
            )
        dtype, wide = q.dtype, compute_dtype(q.dtype)
        q, k, v = (t.to(wide) for t in (q, k, v))
        if key_padding_mask is not None:  # padded keys and values: zero before projecting
            keep = key_padding_mask[:, None, :, None].to(wide)
            k, v = k * keep, v * keep
        # whole (k, max_length) projections: the kernel slices them and writes their gradients
        # in place, with no (k, n) slice gradient copied into a zero (k, max_length) one
        proj_k = self.proj_k.to(wide)
        proj_v = None if self.proj_v is None else self.proj_v.to(wide)
        scale = q.shape[-1] ** -0.5
        if not self.dropout_p:
            return ProjectedAttention.apply(q, k, v, proj_k, proj_v, scale).to(dtype)
        keys = project(proj_k[:, :n], k)  # (b, h, k, d)
        values = project((proj_k if proj_v is None else proj_v)[:, :n], v)
        out = F.scaled_dot_product_attention(q, keys, values, dropout_p=self.dropout_p)
        return out.to(dtype)
