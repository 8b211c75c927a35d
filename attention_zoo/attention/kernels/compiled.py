"""torch.compile for the CUDA implementations: one compiled function per process and Python
function, called with a recompile limit that fails rather than falling back to eager."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import is_fake

# Entries of one compiled function: one per length, dtype, options... more than dynamo's default
# of 8 across a sweep. Past the limit dynamo would run the function eagerly (for flex_attention:
# densely), so it fails instead: a cache that large means something recompiles every call.
RECOMPILE_LIMIT = 256


@functools.cache
def _compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    return torch.compile(fn, dynamic=False)


def run_compiled(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs) compiled; traced as is inside a torch.compile region."""
    if torch.compiler.is_compiling():
        return fn(*args, **kwargs)
    # set and restored by hand: config.patch costs, per call, as much as a long flex call's kernels
    config = torch._dynamo.config
    wanted = {"recompile_limit": RECOMPILE_LIMIT, "fail_on_recompile_limit_hit": True}
    saved = {name: getattr(config, name) for name in wanted if hasattr(config, name)}  # newer torch
    for name in saved:
        setattr(config, name, wanted[name])
    try:
        return _compiled(fn)(*args, **kwargs)
    finally:
        for name, value in saved.items():
            setattr(config, name, value)


def maybe_compiled(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """fn compiled on CUDA tensors (`run_compiled`), called as is elsewhere (the CPU, FakeTensors,
    meta), where its eager result is the same computation."""
    first = args[0]
    if torch.compiler.is_compiling() or (first.device.type == "cuda" and not is_fake(first)):
        return run_compiled(fn, *args, **kwargs)
    return fn(*args, **kwargs)
