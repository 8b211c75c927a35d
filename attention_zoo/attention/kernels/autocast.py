"""Autocast at a core's door: a core and its kernels compute in one dtype, with autocast off.

Under autocast each op casts its own way, and mixed dtypes then meet in a kernel's scatters,
solves and in-place updates. AttentionCore.forward and decode.step turn autocast off around a core
(its inputs cast to autocast's dtype), and each custom autograd Function's backward runs as its
forward did, even when the caller's backward runs under autocast.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import Tensor

F = TypeVar("F", bound=Callable[..., Any])


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


def backward_without_autocast(backward: F) -> F:
    """A custom Function's backward(ctx, *grads) with autocast off on its gradients' device."""

    @functools.wraps(backward)
    def run(ctx: Any, *grads: Any) -> Any:
        t = next((g for g in grads if isinstance(g, Tensor)), None)
        if t is None or not autocasting(t.device.type):
            return backward(ctx, *grads)
        with torch.autocast(t.device.type, enabled=False):
            return backward(ctx, *grads)

    return run  # type: ignore[return-value]
