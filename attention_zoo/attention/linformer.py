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

from ..errors import InputError
from .base import AttentionCore, BlockWeights, check_dropout
from .dispatch import Implementation, KernelTable, cpu_fused, materialised
from .kernels.low_rank.projected import ProjectedAttention, project
from .kernels.sums.plain import compute_dtype
from .options import check_flag, check_int
from .spec import Capabilities, register_attention


@dataclass(frozen=True, kw_only=True)
class LinformerConfig:
    """Options of Linformer attention."""

    proj_length: int = 256  # k: rows the keys and values are projected to
    max_length: int = 4096  # longest sequence the projections cover
    share_kv: bool = True  # one projection for keys and values (the paper's key-value sharing)
    dropout: float = 0.0  # attention-probability dropout over the projected keys, training only
    kernel: str = "auto"  # auto (the pick rule), cpu-fused, math, sdpa

    def __post_init__(self) -> None:
        check_int("proj_length", self.proj_length, minimum=1, backend="linformer")
        check_int("max_length", self.max_length, minimum=1, backend="linformer")
        check_flag("linformer", "share_kv", self.share_kv)
        check_dropout("linformer", self.dropout)
        KERNELS.check_option("linformer", self.kernel)


def _projection(cfg: LinformerConfig) -> nn.Parameter:
    # uniform in +-1/sqrt(k), as the paper's reference code initialises E and F
    bound = 1 / math.sqrt(cfg.proj_length)
    return nn.Parameter(torch.empty(cfg.proj_length, cfg.max_length).uniform_(-bound, bound))


@register_attention(
    "linformer",
    config=LinformerConfig,
    caps=Capabilities(causal=False, exact=False),
    variants=({"kernel": "sdpa"},),
)
class LinformerAttention(AttentionCore):
    """Low-rank attention over learned projections of keys and values; O(n * proj_length)."""

    def __init__(self, cfg: LinformerConfig, *, causal: bool = False) -> None:
        super().__init__(cfg, causal=causal)
        self.proj_k = _projection(cfg)
        self.proj_v = None if cfg.share_kv else _projection(cfg)

    def _projected(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        key_padding_mask: Tensor | None,
        fused: bool = False,
        keep_dtype: bool = False,
    ) -> Tensor:
        """Keys and values projected along the sequence, then softmax attention over them:
        PyTorch's fused CPU op with a segmented backward (fused), or one SDPA call with autograd,
        in the compute dtype or (keep_dtype) the input's."""
        n = q.shape[-2]
        self._check_length(n)
        dtype = q.dtype
        wide = dtype if keep_dtype else compute_dtype(dtype)
        q, k, v = (t.to(wide) for t in (q, k, v))
        if key_padding_mask is not None:  # padded keys and values: zero before projecting
            keep = key_padding_mask[:, None, :, None].to(wide)
            k, v = k * keep, v * keep
        scale = q.shape[-1] ** -0.5
        if fused:
            # whole (k, max_length) projections: the kernel slices them and writes their
            # gradients in place, with no (k, n) slice gradient copied into a zero (k, max_length)
            proj_k = self.proj_k.to(wide)
            proj_v = None if self.proj_v is None else self.proj_v.to(wide)
            return ProjectedAttention.apply(q, k, v, proj_k, proj_v, scale).to(dtype)
        # sliced before the cast: a 16-bit call copies (k, n) columns, not (k, max_length)
        proj_k = self.proj_k[:, :n].to(wide)
        proj_v = proj_k if self.proj_v is None else self.proj_v[:, :n].to(wide)
        keys, values = project(proj_k, k), project(proj_v, v)  # (b, h, k, d)
        out = F.scaled_dot_product_attention(q, keys, values, dropout_p=self.dropout_p)
        return out.to(dtype)

    def attend_block(
        self, x: Tensor, weights: BlockWeights, key_padding_mask: Tensor | None
    ) -> Tensor | None:
        """The block with the sequence projections applied to x before the key and value maps,
        (E x) W_k^T = E (x W_k^T): keys and values cost one (k, n) x (n, hidden) product each
        (one when shared) instead of a projection and a product per map. Not with dropout, nor
        where that costs more (proj_length hidden >= inner (hidden + proj_length))."""
        b, n, hidden = x.shape
        rows, inner = self.cfg.proj_length, weights.w_q.shape[0]
        if (
            self.dropout_p
            or type(self).attend is not LinformerAttention.attend  # a subclass's own attend
            or rows * hidden >= inner * (hidden + rows)
        ):
            return None
        self._check_length(n)
        dtype, wide = x.dtype, compute_dtype(x.dtype)
        x = x.to(wide)
        w_q, w_k, w_v, w_out = (
            w.to(wide) for w in (weights.w_q, weights.w_k, weights.w_v, weights.w_out)
        )
        q = F.linear(x, w_q).view(b, n, weights.heads, -1).transpose(1, 2)
        if key_padding_mask is not None:  # padded keys and values: zero before projecting
            x = x * key_padding_mask[..., None].to(wide)
        mixed_k = torch.matmul(self.proj_k[:, :n].to(wide), x)  # (b, k, hidden)
        mixed_v = mixed_k if self.proj_v is None else torch.matmul(self.proj_v[:, :n].to(wide), x)
        keys, values = (
            F.linear(mixed, w).view(b, -1, weights.heads, q.shape[-1]).transpose(1, 2)
            for mixed, w in ((mixed_k, w_k), (mixed_v, w_v))
        )
        out = F.scaled_dot_product_attention(q, keys, values)
        return F.linear(out.transpose(1, 2).reshape(b, n, -1), w_out).to(dtype)

    def _check_length(self, n: int) -> None:
        if n > self.cfg.max_length:
            raise InputError(
                f"linformer got {n} positions, more than its max_length={self.cfg.max_length}; "
                f"build it with max_length >= {n}"
            )


KERNELS = KernelTable(
    (
        cpu_fused(
            lambda core, *args: core._projected(*args, fused=True),
            "PyTorch's fused CPU attention over the projected keys; backward a segment at a time",
        ),
        materialised(
            lambda core, *args: core._projected(*args, fused=False),
            "projections and SDPA with autograd: a few launches",
        ),
        Implementation(
            name="sdpa",
            summary="one projection product per map and one SDPA call in the input's dtype",
            run=lambda core, *args: core._projected(*args, keep_dtype=True),
            dropout=True,
        ),
    ),
    {
        "cpu": ("cpu-fused", "math"),
        "cpu:bfloat16": ("sdpa", "cpu-fused", "math"),  # faster and leaner there, measured
        "cuda": ("sdpa", "math"),
    },
)
LinformerAttention.kernels = KERNELS
