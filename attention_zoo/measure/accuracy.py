"""How far a kernel's outputs and gradients are from its reference: the RMS of the difference
relative to the RMS of the reference, as fla's own tests compare kernels (a max error is ruled by
one outlier). Numerator and denominator are kept apart, so a failure says which one moved."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class RmsRatio:
    """rms(out - ref) / rms(ref), both RMS computed in at least float32."""

    numerator: float  # rms(out - ref)
    denominator: float  # rms(ref)

    @property
    def ratio(self) -> float:
        """numerator / denominator; 0 when both are 0, inf when only the reference is 0."""
        if self.denominator == 0:
            return 0.0 if self.numerator == 0 else math.inf
        return self.numerator / self.denominator

    def row(self) -> dict[str, float]:
        """The three numbers, for a report or a JSON line."""
        return {**asdict(self), "ratio": self.ratio}


def rms_ratio(out: Tensor, ref: Tensor) -> RmsRatio:
    """out against ref (same shape, any dtypes): a 16-bit reference's RMS is summed in float32,
    where its own squares would round and overflow."""
    wide = torch.promote_types(torch.promote_types(out.dtype, ref.dtype), torch.float32)
    out, ref = out.detach().to(wide), ref.detach().to(wide)
    numerator = (out - ref).square().mean().sqrt()
    return RmsRatio(float(numerator), float(ref.square().mean().sqrt()))


def outputs_and_grads(
    fn: Callable[..., Tensor], inputs: Sequence[Tensor], seed: int = 0
) -> list[Tensor]:
    """fn(*inputs) and the gradient of each input under one random linear loss of the output
    (the same loss for any fn of that output shape, drawn on the CPU from `seed`)."""
    leaves = [t.detach().requires_grad_() for t in inputs]
    out = fn(*leaves)
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(out.shape, generator=g).to(out.device, out.dtype)
    grads = torch.autograd.grad((out * weight).sum(), leaves)
    return [out.detach(), *grads]


def compare(
    got: Sequence[Tensor], want: Sequence[Tensor], names: Sequence[str]
) -> dict[str, RmsRatio]:
    """{name: rms_ratio(got, want)} for paired tensors (e.g. out, dq, dk, dv)."""
    if not len(got) == len(want) == len(names):
        raise ValueError(f"{len(got)} results, {len(want)} references, {len(names)} names")
    return {name: rms_ratio(a, b) for name, a, b in zip(names, got, want)}
