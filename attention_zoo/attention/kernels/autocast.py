"""Autocast at a core's door: a core and its kernels compute in one dtype, with autocast off.

Under autocast each op casts its own way, and mixed dtypes then meet in a kernel's scatters,
solves and in-place updates. AttentionCore.forward and decode.step turn autocast off around a core
(its inputs cast to autocast's dtype); each custom autograd Function's backward runs as its
forward did (backward.py).
"""

from __future__ import annotations

import torch
from torch import Tensor


def autocasting(device: str) -> bool:
    """Whether autocast is on for `device` now."""
    return torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device)


def autocast_dtype(t: Tensor) -> torch.dtype | None:
    """The dtype autocast computes matmuls on t in now, or None: autocast off on t's device, or t
    float64 (autocast leaves it as it is)."""
    if t.dtype != torch.float64 and autocasting(t.device.type):
        return torch.get_autocast_dtype(t.device.type)
    return None


def in_dtype(
    dtype: torch.dtype, q: Tensor, k: Tensor, v: Tensor, extras: dict[str, Tensor]
) -> tuple[Tensor, Tensor, Tensor, dict[str, Tensor]]:
    """q, k, v and the floating extras in `dtype` (k still q under shared QK)."""
    cast = {n: t.to(dtype) if t.is_floating_point() else t for n, t in extras.items()}
    q_cast = q.to(dtype)
    return q_cast, q_cast if k is q else k.to(dtype), v.to(dtype), cast
