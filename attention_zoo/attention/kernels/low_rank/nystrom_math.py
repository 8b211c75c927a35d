"""Nystromformer's computation in plain PyTorch (Xiong et al. 2021): segment-mean landmarks,
softmax(Q Kl^T) pinv(softmax(Ql Kl^T)) softmax(Ql K^T) V with the paper's iterative pseudo-inverse.
A pure function of tensors and ints, so the same code runs eagerly and compiled."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from ..chunked import padded_length
from ..masks import mask_value, real_positions
from ..sums.plain import compute_dtype


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


def segments(
    n: int, landmarks: int, device: torch.device, key_padding_mask: Tensor | None
) -> tuple[int, Tensor, Tensor, bool]:
    """(padded length, real (b | 1, npad) bool, real tokens per segment (b | 1, L), whether
    any position is padding): the sequence cut into num_landmarks segments."""
    npad = padded_length(n, landmarks)
    real = real_positions(n, npad, key_padding_mask, device)
    counts = real.view(-1, landmarks, npad // landmarks).sum(-1)
    return npad, real, counts, key_padding_mask is not None or npad != n


def segment_means(t: Tensor, real: Tensor | None, counts: Tensor) -> Tensor:
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


def landmark_kernel(q_land: Tensor, k_land: Tensor, filled: Tensor, scale: float) -> Tensor:
    """softmax(Ql Kl^T) (b, h, L, L); an empty landmark's row and column are the identity's,
    so it drops out of the pseudo-inverse and out of every product."""
    scores = torch.matmul(q_land, k_land.transpose(-1, -2)) * scale
    cols = filled[:, None, None, :]
    probs = scores.masked_fill(~cols, mask_value(scores.dtype)).softmax(-1)
    empty = ~(filled[:, None, :, None] & cols)
    eye = torch.eye(scores.shape[-1], dtype=torch.bool, device=scores.device)
    return torch.where(empty, eye.to(probs.dtype), probs)


def nystrom_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_padding_mask: Tensor | None,
    landmarks: int,
    iterations: int,
    dropout: float,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """(b, h, n, d) x3 -> (b, h, n, d) in `dtype`: the dtype the n-long products (segment means,
    both SDPA calls) run in, compute_dtype(q.dtype) if None; the landmark kernel and its
    pseudo-inverse run in compute_dtype (float32 for 16-bit inputs) either way. Dropout on each
    query's softmax over the landmarks."""
    n, d = q.shape[-2:]
    npad, real, counts, padded = segments(n, landmarks, q.device, key_padding_mask)
    wide = compute_dtype(q.dtype)
    dtype = dtype or wide
    q, k, v = (t.to(dtype) for t in (q, k, v))
    # only the landmarks need whole segments: the SDPA calls read the unpadded rows
    qp, kp = (F.pad(t, (0, 0, 0, npad - n)) if npad != n else t for t in (q, k))
    q_land, k_land = (segment_means(t, real if padded else None, counts) for t in (qp, kp))
    filled = counts > 0  # a segment of padding only has no landmark
    scale = d**-0.5
    # softmax(Ql K^T) V: the landmark queries over the real keys
    keys_mask = None if key_padding_mask is None else key_padding_mask[:, None, None, :]
    land_values = F.scaled_dot_product_attention(q_land, k, v, attn_mask=keys_mask, scale=scale)
    kernel = landmark_kernel(q_land.to(wide), k_land.to(wide), filled, scale)
    values = torch.matmul(iterative_pinv(kernel, iterations), land_values.to(wide)).to(dtype)
    # softmax(Q Kl^T) (pinv ...): every query over the filled landmarks
    return F.scaled_dot_product_attention(
        q,
        k_land,
        values,
        attn_mask=filled[:, None, None, :] if padded else None,
        dropout_p=dropout,
        scale=scale,
    )
