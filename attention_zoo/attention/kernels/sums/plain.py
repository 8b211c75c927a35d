"""Kernelised attention in plain PyTorch with autograd: what every implementation computes, written
once. `KernelSums` says what a call computes; the feature maps here are the differentiable ones
(the scan keeps its own exact vector-Jacobian products)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn import functional as F

from ..exp import exp

# 16-bit inputs sum their states in float32: the d x d states add up n terms.
_WIDE = {torch.float16: torch.float32, torch.bfloat16: torch.float32}

# Feature maps: phi(x) from x alone, or FAVOR+'s positive random features (needs `proj`).
FEATURE_MAPS = ("elu+1", "relu")
FAVOR = "favor+"


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype sums, inverses and routing scores are computed in: float32 for 16-bit inputs
    (16-bit scores would tie and flip selections), else the input's."""
    return _WIDE.get(dtype, dtype)


@dataclass(frozen=True)
class KernelSums:
    """One call's kernelised attention: out_i = phi(q_i) S_i / (phi(q_i) z_i + eps), sums over
    every key (bidirectional) or keys j <= i (causal, in chunks of `chunk`)."""

    feature_map: str  # one of FEATURE_MAPS, or FAVOR (then `proj` is the (m, d) features)
    causal: bool
    chunk: int
    eps: float
    proj: Tensor | None = None
    scale: float = 1.0  # multiplies q and k before FAVOR's features

    def __post_init__(self) -> None:
        if (self.feature_map == FAVOR) != (self.proj is not None):
            raise ValueError(f"feature map {self.feature_map!r}: proj is given exactly for FAVOR")

    def features(
        self, q: Tensor, k: Tensor, key_padding_mask: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """(phi(q), phi(k)) (b, h, n, m) in compute_dtype, differentiable; padded keys get 0.

        FAVOR: exp(w.q + |w|^2/2 - max) for queries (a per-query factor cancels in the ratio; the
        max is a constant for the gradient) and exp(w.k - |k|^2/2 - |w|^2/2) = exp(-|k - w|^2/2)
        <= 1 for keys, which never overflows and needs no max over keys (that would leak later
        keys into earlier outputs)."""
        wide = compute_dtype(q.dtype)
        q, k = q.to(wide), k.to(wide)
        keep = None if key_padding_mask is None else key_padding_mask[:, None, :, None]
        if self.feature_map != FAVOR:
            phi_k = pointwise(self.feature_map, k)
            return pointwise(self.feature_map, q), phi_k if keep is None else phi_k * keep
        proj = self.proj.to(wide)
        half_w = proj.square().sum(-1) / 2
        logits = torch.matmul(q * self.scale, proj.T) + half_w
        phi_q = exp(logits - logits.amax(-1, keepdim=True).detach())
        ks = k * self.scale
        logits = torch.matmul(ks, proj.T) - ks.square().sum(-1, keepdim=True) / 2 - half_w
        if keep is not None:
            logits = logits.masked_fill(~keep, float("-inf"))
        return phi_q, exp(logits)

    def ratio(self, y: Tensor) -> Tensor:
        """out from y = [numerator, denominator] (b, h, n, d + 1)."""
        return y[..., :-1] / (y[..., -1:] + self.eps)


def pointwise(kind: str, x: Tensor) -> Tensor:
    """phi(x) of a pointwise feature map (elu+1, the paper's: positive, smooth; or relu)."""
    if kind == "elu+1":
        return F.elu(x) + 1
    if kind == "relu":
        return F.relu(x)
    raise ValueError(f"feature map {kind!r} is not one of: {', '.join((*FEATURE_MAPS, FAVOR))}")


def ones_column(x: Tensor) -> Tensor:
    """x with a column of ones: one product then gives sum_j a_ij x_j and sum_j a_ij."""
    return torch.cat([x, x.new_ones(*x.shape[:-1], 1)], dim=-1)


def chunked_causal(a: Tensor, b: Tensor, x: Tensor, state: Tensor, c: int) -> tuple[Tensor, Tensor]:
    """y_i = sum_{j <= i} (a_i . b_j) x_j plus a_i state, over (b, h, L, *) in chunks of c (the
    chunked form of Katharopoulos et al. 2020, section 3.3), where state = sum b_j x_j^T over
    earlier positions. Returns y and the state including these positions."""
    n = a.shape[-2]
    npad = -(-n // c) * c
    if npad != n:  # zero rows add nothing
        a, b, x = (F.pad(t, (0, 0, 0, npad - n)) for t in (a, b, x))
    ac, bc, xc = (t.unflatten(-2, (npad // c, c)) for t in (a, b, x))
    chunk_states = torch.matmul(bc.transpose(-1, -2), xc)  # (b, h, nc, p, r)
    outside = torch.cat([state[:, :, None], chunk_states[:, :, :-1]], dim=2).cumsum(2)
    scores = torch.matmul(ac, bc.transpose(-1, -2)).tril_()  # (b, h, nc, c, c); in place: no
    y = torch.matmul(scores, xc).add_(torch.matmul(ac, outside))  # product saves its output
    return y.flatten(2, 3)[:, :, :n], outside[:, :, -1] + chunk_states[:, :, -1]


def plain_sums(
    sums: KernelSums, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None
) -> Tensor:
    """The whole sequence at once with autograd: bidirectional two products, causal every chunk
    at once (no loop). (b, h, n, d) in compute_dtype(q.dtype)."""
    phi_q, phi_k = sums.features(q, k, key_padding_mask)
    vx = ones_column(v.to(phi_q.dtype))
    if sums.causal:
        state = phi_q.new_zeros(*phi_q.shape[:2], phi_q.shape[-1], vx.shape[-1])
        y = chunked_causal(phi_q, phi_k, vx, state, min(sums.chunk, q.shape[-2]))[0]
    else:
        y = torch.matmul(phi_q, torch.matmul(phi_k.transpose(-1, -2), vx))
    return sums.ratio(y)
