"""Helpers for the conformance suite: small cases any registered backend can be run on."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from attention_zoo import BackendSpec, build_attention, get_backend


def small_options(spec: BackendSpec) -> dict[str, Any]:
    """Options that make chunked/hashed mechanisms non-trivial at test lengths, and seed the random
    ones."""
    opts = spec.defaults()
    chosen: dict[str, Any] = {}
    if "chunk_length" in opts:
        chosen["chunk_length"] = 8  # most test lengths (37, 45, ...) are not multiples: padded
    if "num_hashes" in opts:
        chosen["num_hashes"] = 2
    if "num_buckets" in opts:
        chosen["num_buckets"] = 4
    if "seed" in opts:
        chosen["seed"] = 1234
    return chosen


def make_qkv(
    spec: BackendSpec,
    b: int = 2,
    h: int = 3,
    n: int = 37,
    d: int = 16,
    *,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    requires_grad: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """Random (b, h, n, d) q, k, v; a shared-QK backend gets k = q."""
    q = torch.randn(b, h, n, d, dtype=dtype, device=device, requires_grad=requires_grad)
    v = torch.randn(b, h, n, d, dtype=dtype, device=device, requires_grad=requires_grad)
    k = (
        q
        if spec.caps.shared_qk
        else torch.randn(b, h, n, d, dtype=dtype, device=device, requires_grad=requires_grad)
    )
    return q, k, v


def build(spec: BackendSpec, *, causal: bool, device: str = "cpu", **extra: Any) -> torch.nn.Module:
    return build_attention(
        spec.name, causal=causal, device=device, **{**small_options(spec), **extra}
    )


def reference_for(spec: BackendSpec) -> str:
    """The dense backend an exact backend must equal: shared-qk for shared-QK cores, else full."""
    return "shared-qk" if spec.caps.shared_qk else "full"


def reference(spec: BackendSpec, *, causal: bool) -> torch.nn.Module:
    return build_attention(get_backend(reference_for(spec)).name, causal=causal, device="cpu")


def with_grads(fn: Any, tensors: list[Tensor], seed: int = 5) -> tuple[Tensor, list[Tensor]]:
    """fn's output and the gradients of a fixed random projection of it w.r.t. every input."""
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    out = fn(*leaves)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    (out * weight).sum().backward()
    return out.detach(), [t.grad for t in leaves]
