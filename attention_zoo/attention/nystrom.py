"""Nystromformer attention (Xiong et al. 2021): softmax attention through segment-mean landmarks,
softmax(Q Kl^T) pinv(softmax(Ql Kl^T)) softmax(Ql K^T) V, with an iterative pseudo-inverse; O(n).

Bidirectional only (a landmark averages a segment, future tokens included). Any length: the
sequence is padded to whole segments and landmarks average real tokens only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..errors import OptionError
from .base import AttentionCore, BlockWeights, check_dropout
from .dispatch import Call, Implementation, KernelTable, compile_reason, materialised
from .kernels.compiled import run_compiled
from .kernels.low_rank.nystrom_math import (
    iterative_pinv,
    landmark_kernel,
    nystrom_attention,
    segment_means,
    segments,
)
from .kernels.masks import mask_value, real_keys_mask
from .kernels.sums.plain import compute_dtype
from .options import check_int
from .spec import Capabilities, register_attention


@dataclass(frozen=True, kw_only=True)
class NystromConfig:
    """Options of Nystrom attention."""

    num_landmarks: int = 64  # segment means standing in for the n queries and keys
    pinv_iterations: int = 6  # iterations of the pseudo-inverse (the paper's 6)
    conv_kernel: int = 0  # odd length of the depthwise residual conv on v over positions; 0: off
    heads: int | None = None  # heads of the conv (SelfAttention passes its own)
    dropout: float = 0.0  # dropout on each query's softmax over the landmarks, training only
    kernel: str = "auto"  # auto (the pick rule), math, sdpa, compiled (CUDA)

    def __post_init__(self) -> None:
        check_int("num_landmarks", self.num_landmarks, minimum=1, backend="nystrom")
        check_int("pinv_iterations", self.pinv_iterations, minimum=1, backend="nystrom")
        check_int("conv_kernel", self.conv_kernel, minimum=0, backend="nystrom")
        if self.conv_kernel % 2 == 0 and self.conv_kernel:
            raise OptionError(
                f"nystrom option conv_kernel must be 0 (off) or odd (the output keeps the length), "
                f"got {self.conv_kernel}"
            )
        if self.heads is not None:
            check_int("heads", self.heads, minimum=1, backend="nystrom")
        check_dropout("nystrom", self.dropout)
        KERNELS.check_option("nystrom", self.kernel)


@register_attention(
    "nystrom",
    config=NystromConfig,
    caps=Capabilities(causal=False, exact=False),
    variants=({"kernel": "sdpa"},),
)
class NystromAttention(AttentionCore):
    """Nystrom approximation of softmax attention with segment-mean landmarks; O(n) memory."""

    def __init__(self, cfg: NystromConfig, *, causal: bool = False) -> None:
        super().__init__(cfg, causal=causal)
        self.conv = None
        if cfg.conv_kernel:  # as the paper's code: one kernel per head, over positions
            if cfg.heads is None:  # checked here: a model's config validates before it knows
                raise OptionError(
                    f"nystrom conv_kernel={cfg.conv_kernel} needs heads=<number of heads> for its "
                    "per-head conv (SelfAttention passes it); or conv_kernel=0"
                )
            h, width = cfg.heads, cfg.conv_kernel
            self.conv = nn.Conv2d(h, h, (width, 1), padding=(width // 2, 0), bias=False, groups=h)

    def _nystrom(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        key_padding_mask: Tensor | None,
        compiled: bool = False,
        dtype: torch.dtype | None = None,
    ) -> Tensor:
        """The plain computation, eagerly or compiled, its n-long products in `dtype` (None: the
        compute dtype), and the conv on v."""
        cfg = self.cfg
        args = (q, k, v, key_padding_mask, cfg.num_landmarks, cfg.pinv_iterations, self.dropout_p)
        out = (
            run_compiled(nystrom_attention, *args)
            if compiled
            else nystrom_attention(*args, dtype=dtype)
        )
        if self.conv is not None:  # zero beyond the ends: as padding to whole segments would
            keep = 1 if key_padding_mask is None else key_padding_mask[:, None, :, None]
            out = out + self.conv(v.to(out.dtype) * keep)
        return out.to(q.dtype)

    def attend_block(
        self, x: Tensor, weights: BlockWeights, key_padding_mask: Tensor | None
    ) -> Tensor | None:
        """The block with its maps folded in: the scores of every query over the landmarks are
        x (W_q^T Kl^T), the landmarks' over the keys (Ql W_k) x^T, their values (P x) W_v^T and
        the output A (values W_o^T): four (n, h L, hidden) products, and q, k, v and the
        per-head output never exist. Not with dropout or the conv (they need those), nor where
        folding costs more (h L hidden >= inner (hidden + L): landmarks outnumber head_size)."""
        b, n, hidden = x.shape
        h, landmarks = weights.heads, self.cfg.num_landmarks
        inner = weights.w_q.shape[0]
        call = Call.of(x, inner // h, self.dropout_p, key_padding_mask is not None)
        if (
            self.dropout_p
            or self.conv is not None
            or type(self).attend is not NystromAttention.attend  # a subclass's own attend
            or self.pick(call).name != "math"  # compiled: the core in a few launches
            or h * landmarks * hidden >= inner * (hidden + landmarks)
        ):
            return None
        npad, real, counts, padded = segments(n, self.cfg.num_landmarks, x.device, key_padding_mask)
        dtype, wide = x.dtype, compute_dtype(x.dtype)
        x = x.to(wide)
        w_q, w_k, w_v = (
            weights.per_head(w.to(wide)) for w in (weights.w_q, weights.w_k, weights.w_v)
        )
        scale = w_q.shape[1] ** -0.5
        x_pad = F.pad(x, (0, 0, 0, npad - n)) if npad != n else x
        x_land = segment_means(x_pad[:, None], real if padded else None, counts)[:, 0]
        q_land = torch.einsum("blc,hdc->bhld", x_land, w_q)  # (b, h, L, d)
        k_land = torch.einsum("blc,hdc->bhld", x_land, w_k)
        filled = counts > 0
        kernel = landmark_kernel(q_land, k_land, filled, scale)
        # the landmark queries over the real keys: (b, h L, n) scores, one product with x
        to_keys = torch.einsum("bhld,hdc->bhlc", q_land * scale, w_k).reshape(
            b, h * landmarks, hidden
        )
        scores = torch.matmul(to_keys, x.transpose(1, 2)).view(b, h, landmarks, n)
        if key_padding_mask is not None:
            scores = scores.masked_fill(~real_keys_mask(key_padding_mask), mask_value(wide))
        land_x = torch.matmul(scores.softmax(-1).view(b, h * landmarks, n), x)
        land_values = torch.einsum("bhlc,hdc->bhld", land_x.view(b, h, landmarks, hidden), w_v)
        values = torch.matmul(iterative_pinv(kernel, self.cfg.pinv_iterations), land_values)
        # every query over the filled landmarks: (b, n, h L) scores, one product with x
        to_landmarks = torch.einsum("hdc,bhld->bchl", w_q, k_land * scale)
        scores = torch.matmul(x, to_landmarks.reshape(b, hidden, h * landmarks))
        scores = scores.view(b, n, h, landmarks)
        if padded:
            scores = scores.masked_fill(~filled[:, None, None, :], mask_value(wide))
        w_out = weights.w_out.to(wide).view(hidden, h, -1)
        out_map = torch.einsum("bhld,chd->bhlc", values, w_out).reshape(b, h * landmarks, hidden)
        out = torch.matmul(scores.softmax(-1).view(b, n, h * landmarks), out_map)
        if padded:  # a row of padding only has no landmark: zero, as a fully masked softmax
            out = out * filled.any(-1)[:, None, None].to(wide)
        return out.to(dtype)


KERNELS = KernelTable(
    (
        materialised(
            lambda core, *args: core._nystrom(*args, compiled=False),
            "plain PyTorch: SDPA over the landmarks, iterative pseudo-inverse",
        ),
        Implementation(
            name="sdpa",
            summary="segment means and two SDPA calls in the input's dtype, the pseudo-inverse by "
            "Newton-Schulz in float32",
            run=lambda core, q, *args: core._nystrom(q, *args, dtype=q.dtype),
            dropout=True,
        ),
        Implementation(
            name="compiled",
            summary="the plain computation compiled by torch.compile: a few fused launches",
            run=lambda core, *args: core._nystrom(*args, compiled=True),
            devices=frozenset({"cuda"}),
            dropout=True,
            fake=False,
            environment=compile_reason,
        ),
    ),
    {
        "cpu": ("math",),
        "cpu:bfloat16": ("sdpa", "math"),  # faster and leaner there, measured (docs/backends.md)
        "cuda": ("sdpa", "compiled", "math"),
    },
)
NystromAttention.kernels = KERNELS
