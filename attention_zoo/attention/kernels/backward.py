"""How every hand-written backward runs: as its forward did, and only as a first derivative.

A custom Function's backward runs with autocast off, even when the caller's backward runs under
autocast (a kernel computes in one dtype). Under create_graph=True autograd would differentiate
the backward's arithmetic as if what the forward saved were constants, so second-order gradients
would come out wrong or missing without a word: the backward refuses instead.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import Tensor

from ...errors import UnavailableError
from .autocast import autocasting

F = TypeVar("F", bound=Callable[..., Any])


def hand_written_backward(backward: F) -> F:
    """A custom Function's backward(ctx, *grads): refused under create_graph=True, run with
    autocast off on its gradients' device."""

    name = backward.__qualname__.partition(".")[0]

    @functools.wraps(backward)
    def run(ctx: Any, *grads: Any) -> Any:
        refuse_second_order(
            f"this kernel ({name})",
            "kernel='math' where the backend has one ('zoo list' shows its kernels), or backend "
            "'full'",
        )
        t = next((g for g in grads if isinstance(g, Tensor)), None)
        if t is None or not autocasting(t.device.type):
            return backward(ctx, *grads)
        with torch.autocast(t.device.type, enabled=False):
            return backward(ctx, *grads)

    return run  # type: ignore[return-value]


def refuse_second_order(what: str, instead: str) -> None:
    """UnavailableError when a hand-written backward runs under create_graph=True (autograd turns
    grad mode on in a backward only then): `what` differentiates only once; `instead` would work."""
    if torch.is_grad_enabled():
        raise UnavailableError(
            f"{what} differentiates by hand and only once: second-order gradients "
            f"(create_graph=True) need {instead}"
        )
