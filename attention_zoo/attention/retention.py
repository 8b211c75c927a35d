"""Retention (Sun et al. 2023, "Retentive Network"): linear attention whose state decays by a
fixed factor per head, S_t = gamma_h S_{t-1} + k_t v_t^T, gamma_h = 1 - 2^(-5-h) (RetNet's
schedule over the heads h = 0, 1, ...), o_t = S_t^T q_t / sqrt(d)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from .kernels.sums.plain import compute_dtype
from .recurrent import RECURRENT, RecurrenceConfig, RecurrentCore
from .spec import register_attention


@dataclass(frozen=True, kw_only=True)
class RetentionConfig(RecurrenceConfig):
    """Options of retention."""

    backend: ClassVar[str] = "retention"


def head_log_decays(heads: int, device: torch.device | str = "cpu") -> Tensor:
    """log gamma_h for each head: RetNet's decays 1 - 2^(-5-h), slower for later heads."""
    h = torch.arange(heads, dtype=torch.float64, device=device)
    return torch.log1p(-torch.pow(2.0, -5.0 - h))


@register_attention("retention", config=RetentionConfig, caps=RECURRENT)
class RetentionAttention(RecurrentCore):
    """RetNet's retention: a fixed decay per head, chunked on CPU, fla's kernels on CUDA."""

    def gates(self, q: Tensor, extras: dict[str, Tensor]) -> tuple[Tensor | None, Tensor | None]:
        b, h, n, _ = q.shape
        decay = (
            head_log_decays(h, q.device).to(compute_dtype(q.dtype))[None, :, None].expand(b, h, n)
        )
        return decay, None
