"""Live tensor-storage bytes, counted as storages are created and freed under a TorchDispatchMode.

It works on any device, `meta` and FakeTensors included, which is what makes memory prediction
possible without allocating. Known biases (measured against the profiler on CPU): it cannot see
memory a kernel allocates internally (scratch buffers), and while the mode is active autograd
accumulates gradients out of place, so a backward can read high. Otherwise it agrees closely.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from .memory import PeakMemory
from .modes import UncompiledMode


def _storage_key(t: torch.Tensor) -> tuple[int, torch.UntypedStorage] | None:
    try:
        st = t.untyped_storage()
    except (NotImplementedError, RuntimeError):  # e.g. sparse or nested tensors: no plain storage
        return None
    return st._cdata, st


def tensors_in(*values: Any) -> list[torch.Tensor]:
    """The tensors in an operator's arguments or results (tensors, lists and tuples of them, and
    other values), in order: what torch's pytree finds there, at a fraction of its cost."""
    found: list[torch.Tensor] = []
    stack = list(reversed(values))
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            found.append(x)
        elif isinstance(x, (list, tuple)):
            stack.extend(reversed(x))
        elif isinstance(x, dict):
            stack.extend(reversed(x.values()))
    return found


class StorageTracker(UncompiledMode):
    """Counts bytes of storages created while active and not yet freed; keeps the peak.

    Storages that existed before the mode was entered (parameters, inputs) are not counted, so
    `peak` is the peak *above* what was resident, like the profiler's number.
    """

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self.allocations = 0
        self._sizes: dict[int, int] = {}

    def _freed(self, key: int) -> None:
        self.live -= self._sizes.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = {k[0] for t in tensors_in(args, kwargs) if (k := _storage_key(t)) is not None}
        out = func(*args, **kwargs)
        for t in tensors_in(out):
            if (k := _storage_key(t)) is None:
                continue
            key, st = k
            # An output aliasing an input (views, in-place, out=) is not a new allocation.
            if key in inputs or key in self._sizes:
                continue
            n = st.nbytes()
            self._sizes[key] = n
            weakref.finalize(st, self._freed, key)
            self.allocations += 1
            self.live += n
            self.peak = max(self.peak, self.live)
        return out

    def result(self) -> PeakMemory:
        return PeakMemory(peak_bytes=self.peak, net_bytes=self.live, allocations=self.allocations)


def tracked_peak(fn: Callable[[], Any]) -> tuple[Any, PeakMemory]:
    """Run fn() under a StorageTracker: its result and the peak of live storage bytes above start.

    A cross-check on real devices (misses kernel scratch); the predictor on meta/fake tensors.
    """
    with StorageTracker() as tracker:
        result = fn()
    return result, tracker.result()
