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
from .base import AttentionCore, BlockWeights, check_dropout, mask_value
from .kernels.chunked import check_int, padded_length
from .kernels.sums.scan import compute_dtype
from .spec import Capabilities, register_attention


@dataclass(frozen=True, kw_only=True)
class NystromConfig:
    """Options of Nystrom attention."""

    num_landmarks: int = 64  # segment means standing in for the n queries and keys
    pinv_iterations: int = 6  # iterations of the pseudo-inverse (the paper's 6)
    conv_kernel: int = 0  # odd length of the depthwise residual conv on v over positions; 0: off
    heads: int | None = None  # heads of the conv (SelfAttention passes its own)
    dropout: float = 0.0  # dropout on each query's softmax over the landmarks, training only

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


def iterative_pinv(mat: Tensor, iterations: int) -> Tensor:
    """Pseudo-inverse of (..., L, L) softmax matrices by the paper's iteration (its eq. 14)."""
    eye = torch.eye(mat.shape[-1], dtype=mat.dtype, device=mat.device)
    # start at mat^T / (max column sum * max row sum), per matrix: the iteration then converges
    norm = mat.sum(-2).amax(-1) * mat.sum(-1).amax(-1)
    inv = mat.transpose(-1, -2) / norm[..., None, None]
    for _ in range(iterations):
        kv = torch.matmul(mat, inv)
        inv = 0.25 * torch.matmul(inv, 13 * eye - torch.matmul(kv, 15 * eye - kv @ (7 * eye - kv)))
    return inv


@register_attention("nystrom", config=NystromConfig, caps=Capabilities(causal=False, exact=False))
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

    def attend(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        n, d = q.shape[-2:]
        npad, real, counts, padded = self._segments(n, q.device, key_padding_mask)
        dtype, wide = q.dtype, compute_dtype(q.dtype)
        q, k, v = (t.to(wide) for t in (q, k, v))
        if npad != n:
            q, k, v = (F.pad(t, (0, 0, 0, npad - n)) for t in (q, k, v))
        q_land, k_land = (self._means(t, real if padded else None, counts) for t in (q, k))
        filled = counts > 0  # a segment of padding only has no landmark
        scale = d**-0.5
        # softmax(Ql K^T) V: the landmark queries over the real keys
        land_values = F.scaled_dot_product_attention(
            q_land, k, v, attn_mask=real[:, None, None, :] if padded else None, scale=scale
        )
        kernel = self._landmark_kernel(q_land, k_land, filled, scale)
        values = torch.matmul(iterative_pinv(kernel, self.cfg.pinv_iterations), land_values)
        # softmax(Q Kl^T) (pinv ...): every query over the filled landmarks
        out = F.scaled_dot_product_attention(
            q,
            k_land,
            values,
            attn_mask=filled[:, None, None, :] if padded else None,
            dropout_p=self.dropout_p,
            scale=scale,
        )
        if self.conv is not None:
            out = out + self.conv(v * real[:, None, :, None])
        return out[:, :, :n].to(dtype)

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
        if (
            self.dropout_p
            or self.conv is not None
            or type(self).attend is not NystromAttention.attend  # a subclass's own attend
            or h * landmarks * hidden >= inner * (hidden + landmarks)
        ):
            return None
        npad, real, counts, padded = self._segments(n, x.device, key_padding_mask)
        dtype, wide = x.dtype, compute_dtype(x.dtype)
        x = x.to(wide)
        w_q, w_k, w_v = (
            weights.per_head(w.to(wide)) for w in (weights.w_q, weights.w_k, weights.w_v)
        )
        scale = w_q.shape[1] ** -0.5
        x_pad = F.pad(x, (0, 0, 0, npad - n)) if npad != n else x
        x_land = self._means(x_pad[:, None], real if padded else None, counts)[:, 0]
        q_land = torch.einsum("blc,hdc->bhld", x_land, w_q)  # (b, h, L, d)
        k_land = torch.einsum("blc,hdc->bhld", x_land, w_k)
        filled = counts > 0
        kernel = self._landmark_kernel(q_land, k_land, filled, scale)
        # the landmark queries over the real keys: (b, h L, n) scores, one product with x
        to_keys = torch.einsum("bhld,hdc->bhlc", q_land * scale, w_k).reshape(
            b, h * landmarks, hidden
        )
        scores = torch.matmul(to_keys, x.transpose(1, 2)).view(b, h, landmarks, n)
        if key_padding_mask is not None:
            scores = scores.masked_fill(~key_padding_mask[:, None, None, :], mask_value(wide))
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

    def _segments(
        self, n: int, device: torch.device, key_padding_mask: Tensor | None
    ) -> tuple[int, Tensor, Tensor, bool]:
        """(padded length, real (b | 1, npad) bool, real tokens per segment (b | 1, L), whether
        any position is padding): the sequence cut into num_landmarks segments."""
        landmarks = self.cfg.num_landmarks
        npad = padded_length(n, landmarks)
        real = (torch.arange(npad, device=device) < n)[None]  # (b | 1, npad)
        if key_padding_mask is not None:
            real = real & F.pad(key_padding_mask, (0, npad - n), value=False)
        counts = real.view(-1, landmarks, npad // landmarks).sum(-1)
        return npad, real, counts, key_padding_mask is not None or npad != n

    @staticmethod
    def _means(t: Tensor, real: Tensor | None, counts: Tensor) -> Tensor:
        """(b, h, npad, d) -> (b, h, L, d): the mean of each segment's real rows. Without padding
        (real None) a sum over a view of t; with padding, a product with the 0/1 weights, so no
        masked copy of t is made (the product copies t only where its layout cannot be batched,
        e.g. the block's (b, n, h, d) projections)."""
        b, h, npad, d = t.shape
        landmarks = counts.shape[-1]
        segments = t.reshape(b, h, landmarks, npad // landmarks, d)
        if real is None:  # the division on the means: the sum's gradient stays a broadcast view
            return segments.sum(-2) / (npad // landmarks)
        weights = real.view(-1, 1, landmarks, 1, npad // landmarks).to(t.dtype)
        sums = torch.matmul(weights, segments).squeeze(-2)
        return sums / counts.clamp_min(1)[:, None, :, None]

    @staticmethod
    def _landmark_kernel(q_land: Tensor, k_land: Tensor, filled: Tensor, scale: float) -> Tensor:
        """softmax(Ql Kl^T) (b, h, L, L); an empty landmark's row and column are the identity's,
        so it drops out of the pseudo-inverse and out of every product."""
        scores = torch.matmul(q_land, k_land.transpose(-1, -2)) * scale
        cols = filled[:, None, None, :]
        probs = scores.masked_fill(~cols, mask_value(scores.dtype)).softmax(-1)
        empty = ~(filled[:, None, :, None] & cols)
        eye = torch.eye(scores.shape[-1], dtype=torch.bool, device=scores.device)
        return torch.where(empty, eye.to(probs.dtype), probs)
