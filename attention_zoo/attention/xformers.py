"""Full attention through xformers.ops.memory_efficient_attention (CUDA kernels only)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn import functional as F

from .base import AttentionCore, check_dropout
from .dispatch import Call, Implementation, KernelTable
from .kernels.masks import additive_mask
from .spec import Capabilities, register_attention


@functools.cache
def _import_error() -> str | None:
    try:
        import xformers.ops  # noqa: F401
    except Exception as exc:  # ImportError, or a broken build raising at import
        return f"xformers is not importable ({type(exc).__name__}: {exc}); pip install xformers"
    return None


@functools.cache
def _kernel_error() -> str | None:
    """One tiny call: a build made for another torch imports, then has no CUDA kernel to run."""
    import xformers
    import xformers.ops as xops

    x = torch.zeros(1, 8, 1, 64, device="cuda", dtype=torch.float16)
    try:
        xops.memory_efficient_attention(x, x, x)
    except Exception as exc:
        lines = [line.strip() for line in str(exc).splitlines()]
        detail = next((line for line in lines if "buil" in line), lines[0] if lines else "")
        return (
            f"xformers {xformers.__version__} has no working CUDA kernel with torch "
            f"{torch.__version__} ({detail}); install the xformers build made for this torch"
        )
    return None


def xformers_availability(device: str) -> str | None:
    if device == "meta":  # shapes only: counted as SDPA's same computation (_counted)
        return None
    if device != "cuda":
        return f"xformers kernels need CUDA; asked to run on {device!r}"
    if not torch.cuda.is_available():
        return "xformers kernels need CUDA, and no CUDA device is visible"
    return _import_error() or _kernel_error()


@dataclass(frozen=True, kw_only=True)
class XFormersConfig:
    """Options of the xformers backend."""

    dropout: float = 0.0  # attention-probability dropout (xformers' p), in training mode only
    kernel: str = "auto"  # auto or memory-efficient: one implementation

    def __post_init__(self) -> None:
        check_dropout("xformers", self.dropout)
        KERNELS.check_option("xformers", self.kernel)


@register_attention(
    "xformers",
    config=XFormersConfig,
    caps=Capabilities(
        devices=frozenset({"cuda", "meta"}), dtypes=frozenset({"float32", "bfloat16", "float16"})
    ),
    availability=xformers_availability,
)
class XFormersAttention(AttentionCore):
    """Full attention via xformers' memory-efficient CUDA kernel; scores never materialised."""

    def _xformers(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        if Call.of(q, q.shape[-1]).fake:
            return self._counted(q, k, v, key_padding_mask)
        import xformers.ops as xops

        bias = None if key_padding_mask is None else self._dense_bias(q, key_padding_mask)
        # xformers wants (b, n, h, d).
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if bias is None and self.causal:
            bias = xops.LowerTriangularMask()
        out = xops.memory_efficient_attention(q, k, v, attn_bias=bias, p=self.dropout_p)
        return out.transpose(1, 2)

    def _counted(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        """On shapes only (meta, FakeTensors): SDPA's memory-efficient attention, the same
        computation with the same bias, so parameters, states, FLOPs (torch's formula) and memory
        can be counted where xformers' kernels cannot run, or are not installed."""
        bias = None if key_padding_mask is None else self._dense_bias(q, key_padding_mask)
        causal = self.causal and bias is None
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=bias, dropout_p=self.dropout_p, is_causal=causal
        )

    def _dense_bias(self, q: Tensor, key_padding_mask: Tensor) -> Tensor:
        """(b, h, n, n) additive bias in q's dtype hiding padded keys (and, causal, the future):
        xformers takes no boolean mask with padding, and wants a bias's rows 8-aligned, so the
        bias is a slice of rows padded to a multiple of 8."""
        b, h, n, _ = q.shape
        rows = torch.empty(b, h, n, -(-n // 8) * 8, dtype=q.dtype, device=q.device)
        allowed = self.allowed(q, key_padding_mask).expand(b, h, n, n)
        return additive_mask(allowed, q.dtype, out=rows[..., :n])


KERNELS = KernelTable(
    (
        Implementation(
            name="memory-efficient",
            summary="xformers.ops.memory_efficient_attention (its CUDA kernels)",
            run=XFormersAttention._xformers,
            devices=frozenset({"cuda", "meta"}),
            dropout=True,
        ),
    ),
    {"cuda": ("memory-efficient",), "meta": ("memory-efficient",)},
)
XFormersAttention.kernels = KERNELS
