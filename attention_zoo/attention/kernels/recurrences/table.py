"""The implementations of the recurrences, shared by every recurrent core: a core gives
`recurrence_inputs(q, k, v, key_padding_mask, extras)` (the decays and step sizes its call runs
with); the decay-gated ones (no step size) and the delta rule each have a chunked form."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from ...dispatch import Call, Implementation, KernelTable
from ..fla_package import FLA_DTYPES, fla_environment
from .decay import chunk_decay
from .delta import chunk_delta
from .fla import fla_recurrence


@dataclass(frozen=True)
class RecurrenceInputs:
    """What one call of a recurrence computes with: q, k (b, h, n, dk), v (b, h, n, dv), the log
    decay (b, h, n) or (b, h, n, dk) (None: no decay), the step size (b, h, n) (None: additive,
    no delta rule), the output scale, whether the delta rule L2-normalises q and k (its kernels
    do, a segment at a time)."""

    q: Tensor
    k: Tensor
    v: Tensor
    log_decay: Tensor | None
    beta: Tensor | None
    scale: float
    normalise_qk: bool = False

    def __post_init__(self) -> None:
        if self.normalise_qk and self.beta is None:
            raise ValueError("q and k are L2-normalised in the delta rule's kernels only")


# (q, k, v, log_decay, beta, scale, chunk_length, initial_state) -> (out, final state)
Recurrence = Callable[..., tuple[Tensor, Tensor]]


def run_recurrence(
    decay: Callable[..., tuple[Tensor, Tensor]],
    delta: Callable[..., tuple[Tensor, Tensor]],
    x: RecurrenceInputs,
    chunk_length: int,
    initial_state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The delta rule where the call has step sizes, else the decay-gated sums."""
    options = {"scale": x.scale, "chunk_length": chunk_length, "initial_state": initial_state}
    if x.beta is not None:
        return delta(x.q, x.k, x.v, x.beta, x.log_decay, normalise_qk=x.normalise_qk, **options)
    return decay(x.q, x.k, x.v, x.log_decay, **options)


def chunked(
    x: RecurrenceInputs, chunk_length: int, initial_state: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Our chunked forms (any device): matmuls inside a chunk, the state across chunks."""
    return run_recurrence(chunk_decay, chunk_delta, x, chunk_length, initial_state)


def fla_chunked(
    x: RecurrenceInputs, chunk_length: int, initial_state: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """fla's chunked Triton kernels (CUDA): a forward with a backward, at any length."""
    return _fla(x, chunk_length, initial_state, chunked=True)


def fla_step(
    x: RecurrenceInputs, chunk_length: int, initial_state: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """A decoding step through fla: its fused recurrent kernels for at most a chunk of new tokens
    (they have no backward: decoding needs none), its chunked ones for a longer prompt."""
    if x.q.shape[2] <= chunk_length:
        return _fla(x, chunk_length, initial_state, chunked=False)
    return fla_chunked(x, chunk_length, initial_state)


def _fla(
    x: RecurrenceInputs, chunk_length: int, initial_state: Tensor | None, *, chunked: bool
) -> tuple[Tensor, Tensor]:
    return fla_recurrence(
        x.q, x.k, x.v, x.beta, x.log_decay, scale=x.scale, chunk_length=chunk_length,
        initial_state=initial_state, chunked=chunked, normalise_qk=x.normalise_qk,
    )  # fmt: skip


# the implementations' decoding steps by name: a step runs the picked one from its state
RECURRENCES: dict[str, Recurrence] = {"chunk": chunked, "fla": fla_step}


def _run(fn: Callable[..., tuple[Tensor, Tensor]]) -> Any:
    """An implementation's run: the core's inputs for the call, then `fn`'s output."""

    def run(
        core: Any, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, **extras: Tensor
    ) -> Tensor:
        x = core.recurrence_inputs(q, k, v, mask, extras)
        return fn(x, core.cfg.chunk_length)[0].to(q.dtype)

    return run


def _fla_shape(core: Any, call: Call) -> str | None:
    keys, values = call.head_dim, call.head_dim * core.cfg.expand_v
    if keys % 2 or values % 2:
        return f"fla's 16-bit backward needs even key and value widths, not {keys} and {values}"
    delta = "beta" in {e.name for e in core.layout.extras}
    if delta and keys > FLA_DELTA_KEYS:
        return f"fla's delta-rule kernels take key widths up to {FLA_DELTA_KEYS}, not {keys}"
    return None


FLA_CHUNKS = (16, 32, 64)  # the chunk sizes fla's delta-rule kernels take
FLA_DELTA_KEYS = 256  # the widest keys they take


def _fla_chunk(core: Any, call: Call) -> str | None:
    chunk = core.cfg.chunk_length
    if "beta" in {e.name for e in core.layout.extras} and chunk not in FLA_CHUNKS:
        return f"fla's delta-rule kernels take chunk_length 16, 32 or 64, not {chunk}"
    return None


RECURRENCE_KERNELS = KernelTable(
    (
        Implementation(
            name="chunk",
            summary="chunked: matmuls inside a chunk (the delta rule's triangular system solved "
            "in closed form), the state carried across chunks, a written-out backward a segment "
            "at a time",
            run=_run(chunked),
        ),
        Implementation(
            name="fla",
            summary="fla-core's chunked Triton kernels (CUDA)",
            run=_run(fla_chunked),
            devices=frozenset({"cuda"}),
            dtypes=FLA_DTYPES,
            fake=False,
            environment=fla_environment,
            checks=(_fla_shape, _fla_chunk),
        ),
    ),
    {"cpu": ("chunk",), "cuda": ("fla", "chunk")},
)
