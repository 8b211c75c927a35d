"""Causal kernelised attention through fla's chunked Triton kernel (flash-linear-attention,
`fla.ops.linear_attn.chunk_linear_attn`): our features in float32, handed over in the input's dtype
in fla's (b, n, h, m) layout, values with a column of ones so one call returns the numerator and
the denominator (our eps, not fla's normalisation). fla is imported only where it runs (CUDA)."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor
from torch.nn import functional as F

from .plain import KernelSums, ones_column

# fla's op: (q, k, v (b, n, h, *), scale=..., normalize=...) -> (out (b, n, h, v), state)
LinearOp = Callable[..., tuple[Tensor, object]]


def fla_op() -> LinearOp:
    """fla's chunked causal linear attention (imports fla: Triton and CUDA)."""
    from fla.ops.linear_attn import chunk_linear_attn

    return chunk_linear_attn


def fla_sums(
    sums: KernelSums,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_padding_mask: Tensor | None,
    op: LinearOp | None = None,
) -> Tensor:
    """(b, h, n, d) in compute_dtype(q.dtype); causal only. `op` stands in for fla's kernel (the
    CPU tests pass a plain PyTorch function of the same contract)."""
    if not sums.causal:
        raise ValueError("fla's linear attention kernels are causal")
    phi_q, phi_k = sums.features(q, k, key_padding_mask)
    d = v.shape[-1]
    vx = ones_column(v)
    if vx.shape[-1] % 2:  # fla's 16-bit backward takes even widths: a zero column more
        vx = F.pad(vx, (0, 1))
    layout = [t.to(q.dtype).transpose(1, 2) for t in (phi_q, phi_k, vx)]
    y, _ = (op or fla_op())(*layout, scale=1.0, normalize=False)
    return sums.ratio(y.transpose(1, 2)[..., : d + 1].to(phi_q.dtype))
