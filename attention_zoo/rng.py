"""Record and replay the global RNG state, so recomputed forwards draw the same random numbers.

Reversible layers run each sublayer again in backward; dropout masks and LSH rotations (drawn from
the global torch RNG when no seed is set) must come out identical, or the recovered inputs and the
gradients are wrong (Gomez et al. 2017; Kitaev et al. 2020, section 3).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class RNGState:
    """The CPU generator state, plus the CUDA generator state of one device when it was used."""

    cpu: Tensor
    cuda_device: int | None = None
    cuda: Tensor | None = None


def record_rng(device: torch.device | str = "cpu") -> RNGState:
    """Snapshot the CPU RNG and, for a CUDA `device`, that device's RNG (draws nothing)."""
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return RNGState(torch.get_rng_state(), index, torch.cuda.get_rng_state(index))
    return RNGState(torch.get_rng_state())


@contextmanager
def replay_rng(state: RNGState) -> Iterator[None]:
    """Run the block with the global RNG set to `state`; the RNG outside is left as it was."""
    devices = [state.cuda_device] if state.cuda_device is not None else []
    with torch.random.fork_rng(devices=devices):
        torch.set_rng_state(state.cpu)
        if state.cuda is not None:
            torch.cuda.set_rng_state(state.cuda, state.cuda_device)
        yield
