"""exp and log-sum-exp of attention scores, computed as exp2(x log2 e).

torch.exp on CPU is many times slower on inputs whose result is subnormal or zero (masked scores,
scores far below their row's maximum, an -inf); torch.exp2 is not. The product x log2 e is taken
in float32 at least, so results agree with torch.exp's to the rounding of one float32 product.
Full-size scores and probabilities go through here; small per-round or per-token tensors may use
torch's own.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

LOG2_E = 1.0 / math.log(2.0)
_NARROW = (torch.float16, torch.bfloat16)  # their product x log2 e would round away |x| ulps


def exp(x: Tensor) -> Tensor:
    """exp(x), differentiable."""
    if x.dtype in _NARROW:
        return torch.exp2(x.float() * LOG2_E).to(x.dtype)
    return torch.exp2(x * LOG2_E)


def exp_(x: Tensor) -> Tensor:
    """exp(x) in place (a tensor autograd does not need before the call)."""
    if x.dtype in _NARROW:
        return x.copy_(torch.exp2(x.float().mul_(LOG2_E)))
    return x.mul_(LOG2_E).exp2_()


def logsumexp(x: Tensor, dim: int = -1, keepdim: bool = False) -> Tensor:
    """log(sum(exp(x))) over `dim`, as torch.logsumexp, differentiable; a row of -inf gives -inf
    and a zero gradient."""
    top = x.detach().amax(dim, keepdim=True)
    top = top.masked_fill(~torch.isfinite(top), 0.0)
    total = exp_(x - top).sum(dim, keepdim=True)
    tiny = torch.finfo(total.dtype).tiny  # keeps log's gradient finite where the total is 0
    out = torch.where(total == 0, float("-inf"), torch.log(total.clamp_min(tiny))) + top
    return out if keepdim else out.squeeze(dim)
