"""Decay-gated linear recurrences through fla's Triton kernels (flash-linear-attention, CUDA): a
scalar decay per head and token (RetNet's fixed decay broadcast, Mamba2's SSD) by
`fla.ops.simple_gla`, a decay per key channel by `fla.ops.gla`; chunked kernels for prefill and
training, fused recurrent ones for decoding. Same contract as `decay.chunk_decay`, our (b, h, n, d)
layout converted to fla's (b, n, h, d). fla is imported only where it runs."""

from __future__ import annotations

from torch import Tensor


def fla_chunk_decay(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    log_decay: Tensor | None = None,
    *,
    scale: float,
    chunk_length: int = 64,
    initial_state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """As chunk_decay, by fla's chunk_simple_gla / chunk_gla (their own chunk of 64 tokens:
    chunk_length is taken for the common signature only). The final state is float32."""
    return _fla_decay(q, k, v, log_decay, scale, initial_state, chunked=True)


def fla_recurrent_decay(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    log_decay: Tensor | None = None,
    *,
    scale: float,
    chunk_length: int = 64,
    initial_state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """As chunk_decay, token by token in one fused kernel (fused_recurrent_simple_gla /
    fused_recurrent_gla): the decoding step. chunk_length is unused. The final state is float32."""
    return _fla_decay(q, k, v, log_decay, scale, initial_state, chunked=False)


def _fla_decay(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    log_decay: Tensor | None,
    scale: float,
    initial_state: Tensor | None,
    *,
    chunked: bool,
) -> tuple[Tensor, Tensor]:
    from fla.ops import gla, simple_gla

    # fla cumulates the log decays in their own dtype and takes (chunk_gla: only) a float32 state
    g = None if log_decay is None else log_decay.transpose(1, 2).float()
    options = {
        "scale": scale,
        "initial_state": None if initial_state is None else initial_state.float(),
        "output_final_state": True,
    }
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (b, n, h, d)
    if g is not None and g.dim() == 4:  # a decay per key channel
        if chunked:
            o, state = gla.chunk_gla(q, k, v, g=g, **options)
        else:
            o, state = gla.fused_recurrent_gla(q, k, v, gk=g, **options)
    else:
        op = simple_gla.chunk_simple_gla if chunked else simple_gla.fused_recurrent_simple_gla
        o, state = op(q, k, v, g=g, **options)
    return o.transpose(1, 2), state
