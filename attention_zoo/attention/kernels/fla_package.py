"""fla-core (flash-linear-attention) as the kernel tables see it: whether its Triton kernels can
run here, and the dtype they run in (the one their accuracy tests cover)."""

from __future__ import annotations

import importlib.metadata

import torch

from ..dispatch import compile_reason, package_reason

FLA_VERSION = (0, 6)  # fla-core from 0.6 takes (b, n, h, *) only (earlier: head_first=True)

# Their products of float32 inputs run in TF32, and in float16 performer's features underflow
# and linear attention's sums overflow: other dtypes run our kernels.
FLA_DTYPES = frozenset({torch.bfloat16})


def fla_reason() -> str | None:
    """Why fla-core cannot be used here (found without importing it), or None."""
    if reason := package_reason("fla", "fla-core"):
        return reason
    try:
        version = tuple(int(p) for p in importlib.metadata.version("fla-core").split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        version = (0, 0)
    if version < FLA_VERSION:
        return f"needs fla-core >= {'.'.join(map(str, FLA_VERSION))} (its (b, n, h, *) layout)"
    return None


def fla_environment(device: str) -> str | None:
    """An fla implementation's environment check: the package and Triton on `device`."""
    return fla_reason() or compile_reason(device)
