"""Full attention through torch.nn.functional.scaled_dot_product_attention (fused kernels)."""

from __future__ import annotations

import functools
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from .base import AttentionCore, check_dropout
from .decode import KVCache, kv_cache, kv_cache_bytes, kv_step, sdpa_attention
from .dispatch import Call, Check, Implementation, KernelTable
from .inputs import check_kv_heads
from .spec import Capabilities, register_attention

BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}
NAMES = {backend: name for name, backend in BACKENDS.items()}


@dataclass(frozen=True, kw_only=True)
class SDPAConfig:
    """Options of the SDPA backend."""

    kernel: str = "auto"  # auto (PyTorch's own choice), or force one: flash, efficient, cudnn, math
    dropout: float = 0.0  # attention-probability dropout (SDPA's dropout_p), in training only
    kv_heads: int | None = None  # shared KV heads (GQA; 1: MQA); None: one per query head

    def __post_init__(self) -> None:
        check_dropout("sdpa", self.dropout)
        check_kv_heads("sdpa", self.kv_heads)
        KERNELS.check_option("sdpa", self.kernel)


@register_attention("sdpa", config=SDPAConfig, caps=Capabilities(), variants=({"kv_heads": 1},))
class SDPAAttention(AttentionCore):
    """Full attention via F.scaled_dot_product_attention; PyTorch picks or is told the kernel."""

    cache_positions = True  # its KV-cache step reads positions from the cache

    def _sdpa(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        key_padding_mask: Tensor | None,
        backend: SDPBackend | None,
    ) -> Tensor:
        mask, causal = None, self.causal
        if key_padding_mask is not None:  # SDPA takes is_causal or a mask: causality goes in it
            mask = self.allowed(q, key_padding_mask)
            causal = False
        context = sdpa_kernel([backend]) if backend is not None else nullcontext()
        with context:
            return F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=mask,
                dropout_p=self.dropout_p,
                is_causal=causal,
                enable_gqa=k.shape[1] != q.shape[1],
            )

    # ---- decoding: a KV cache ----------------------------------------------------------------

    init_state = staticmethod(kv_cache)
    state_bytes = staticmethod(kv_cache_bytes)

    def step(
        self, q: Tensor, k: Tensor, v: Tensor, state: KVCache, key_padding_mask: Tensor | None
    ) -> tuple[Tensor, KVCache]:
        """New tokens against every cached key, through SDPA (see attention/decode.py); the
        prefill is the forward (is_causal: never a (t, n) mask)."""
        return kv_step(self, q, k, v, state, key_padding_mask, sdpa_attention)


def _run(
    core: SDPAAttention,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_padding_mask: Tensor | None,
    name: str,
) -> Tensor:
    """Named: that kernel only; auto: PyTorch's dispatch as is (it also sees the mask)."""
    backend = BACKENDS[name] if core.requested_kernel == name else None
    return core._sdpa(q, k, v, key_padding_mask, backend)


def _visible(device: str) -> bool:
    return device != "cuda" or torch.cuda.is_available()


def _probe(core: SDPAAttention, call: Call) -> tuple[Tensor, Tensor, Tensor | None, bool]:
    """Small inputs like the call's, as PyTorch's SDPA dispatch sees them: queries, keys (one
    head per group of query heads), the mask a key padding makes (causality then goes into it),
    is_causal."""
    n = min(call.length, 128)
    x = torch.empty(1, call.group, n, call.head_dim, dtype=call.dtype, device=call.device)
    kv = x[:, :1]
    if not call.masked:
        return x, kv, None, core.causal
    return x, kv, torch.ones(1, 1, n, n, dtype=torch.bool, device=call.device), False


def _undecidable(call: Call) -> bool:
    """No dispatch to ask: shapes only, a device that is not there, or inside torch.compile
    (its tracing takes no integer answer from PyTorch's dispatch)."""
    return call.fake or not _visible(call.device) or torch.compiler.is_compiling()


def _pytorch_reason(name: str) -> Check:
    def check(core: SDPAAttention, call: Call) -> str | None:
        """PyTorch's own reason why this SDPA kernel cannot run the call."""
        if not _visible(call.device) and not call.fake:
            return "no CUDA device is visible to ask PyTorch's SDPA dispatch"
        if _undecidable(call):
            return None
        x, kv, mask, causal = _probe(core, call)
        try:
            with sdpa_kernel([BACKENDS[name]]):
                _choice(x, kv, mask, call, causal)
        except RuntimeError as exc:
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
            return "PyTorch says: " + (lines[0] if lines else type(exc).__name__)
        return None

    return check


def _pytorch_choice(core: SDPAAttention, call: Call) -> str:
    """The kernel PyTorch's SDPA dispatch picks for the call; where it cannot be asked, "math"
    stands in (auto runs PyTorch's dispatch unforced whatever the name)."""
    if _undecidable(call):
        return "math"
    x, kv, mask, causal = _probe(core, call)
    return NAMES.get(SDPBackend(_choice(x, kv, mask, call, causal)), "math")


def _choice(x: Tensor, kv: Tensor, mask: Tensor | None, call: Call, causal: bool) -> int:
    """PyTorch's SDPA dispatch's answer for the probe."""
    dropout, grouped = float(call.dropout), call.group > 1
    return torch._fused_sdp_choice(x, kv, kv, mask, dropout, causal, enable_gqa=grouped)


KERNELS = KernelTable(
    tuple(
        Implementation(
            name=name,
            summary=f"PyTorch's SDPA, its {name} kernel",
            run=functools.partial(_run, name=name),
            dropout=True,
            grouped=True,
            checks=() if name == "math" else (_pytorch_reason(name),),
        )
        for name in BACKENDS
    ),
    {},
    choose=_pytorch_choice,
)
SDPAAttention.kernels = KERNELS
