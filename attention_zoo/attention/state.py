"""What the decoding contract speaks of (AttentionCore's init_state, state_bytes and step; run by
decode.py): the shape a state is made for, what every state holds, and the kinds of decoding a
backend declares."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from ..errors import InputError

CACHED, CACHED_HF, RECOMPUTE, NONE = "cached", "cached-hf", "recompute", "none"
DECODINGS = (CACHED, CACHED_HF, RECOMPUTE, NONE)
# What each kind means, in one line (tables and the report say it).
DECODING_TEXT = {
    CACHED: "own state, equal to the causal forward",
    CACHED_HF: "own state, as transformers' cached generation",
    RECOMPUTE: "recomputes the whole prefix every token",
    NONE: "cannot decode (bidirectional only)",
}


@dataclass(frozen=True)
class StateShape:
    """What a state is made for: (batch, heads, head_dim) tokens, up to max_length positions;
    keys and values on kv_heads heads (default: heads), values value_dim wide (default:
    head_dim), as the core's input layout declares (inputs.py)."""

    batch: int
    heads: int
    head_dim: int
    max_length: int  # the most positions the state may consume (prompt and new tokens)
    dtype: torch.dtype = torch.float32
    device: torch.device | str = "cpu"
    kv_heads: int | None = None
    value_dim: int | None = None

    @classmethod
    def of(cls, q: Tensor, k: Tensor, v: Tensor, max_length: int) -> StateShape:
        """The shape of a state for tokens like q (b, h, t, d), k (b, kv, t, d) and
        v (b, kv, t, d_v)."""
        b, h, _, d = q.shape
        return cls(b, h, d, max_length, q.dtype, q.device, k.shape[1], v.shape[-1])

    @property
    def kv(self) -> int:
        """Key/value heads."""
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def dv(self) -> int:
        """Value width."""
        return self.head_dim if self.value_dim is None else self.value_dim

    def tensor(self, *shape: int, dtype: torch.dtype | None = None) -> Tensor:
        """A zeroed tensor of this dtype (or `dtype`) on this device."""
        return torch.zeros(shape, dtype=dtype or self.dtype, device=self.device)

    def itemsize(self, dtype: torch.dtype | None = None) -> int:
        return torch.empty((), dtype=dtype or self.dtype).element_size()


@dataclass(frozen=True, kw_only=True)
class DecodeState:
    """What every decoding state holds besides its tensors: its shape and the positions seen."""

    shape: StateShape
    length: int = 0  # positions consumed so far (prefill and steps)
    # True for a state whose steps only append (a KV cache): an earlier state of it stays valid
    appends_only: ClassVar[bool] = False
    # why a CUDA graph cannot capture a step on it; "" where a state says it can: fixed shapes,
    # written in place, nothing its kernels read from the host
    uncapturable: ClassVar[str] = "does not say its step can be captured (uncapturable)"

    def tensors(self) -> list[Tensor]:
        """Its tensors, those held in dicts (per extra input) included."""
        found = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            items = value.values() if isinstance(value, dict) else (value,)
            found += [t for t in items if isinstance(t, Tensor)]
        return found

    def nbytes(self) -> int:
        """Bytes of its tensors (shapes only: the meta device gives the same number)."""
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def truncated(self, n: int) -> DecodeState:
        """The state as if only the first n positions had been consumed: drops trailing padding
        a prefill was given (transformers pads a prompt to whole chunks). A state that cannot
        forget positions refuses."""
        if n == self.length:
            return self
        raise InputError(
            f"a {type(self).__name__} cannot forget positions {n}..{self.length - 1} (its bounded "
            "buffers overwrote what the earlier positions need); prefill without trailing padding"
        )
