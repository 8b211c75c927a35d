"""The recurrences through fla's Triton kernels (flash-linear-attention) on CUDA: the decay-gated
sums by `fla.ops.simple_gla` (a scalar decay per head and token: RetNet, Mamba2's SSD) or
`fla.ops.gla` (a decay per key channel), the delta rule by `fla.ops.delta_rule` and
`fla.ops.gated_delta_rule`. Our (b, h, n, d) layout is converted to fla's (b, n, h, d); the delta
rule L2-normalises keys and queries in its kernel where asked. fla is imported where it runs."""

from __future__ import annotations

from torch import Tensor


def fla_recurrence(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None,
    log_decay: Tensor | None,
    *,
    scale: float,
    chunk_length: int = 64,
    initial_state: Tensor | None = None,
    chunked: bool = True,
    normalise_qk: bool = False,
) -> tuple[Tensor, Tensor]:
    """As chunk_delta (chunk_decay where beta is None) by fla's chunked kernels, or not `chunked`
    its fused recurrent ones (decoding; the gated delta one has no backward); the state in float32.
    The decay kernels keep their own 64-token chunks; fla's delta rule without a decay takes 16-bit
    inputs only. normalise_qk: the delta rule's (RecurrenceInputs refuses it without beta)."""
    options = {"scale": scale, "output_final_state": True}
    if beta is None:
        o, state = _decay(q, k, v, log_decay, initial_state, options, chunked)
    else:
        options["use_qk_l2norm_in_kernel"] = normalise_qk
        o, state = _delta(q, k, v, beta, log_decay, initial_state, options, chunk_length, chunked)
    return o.transpose(1, 2), state


def _decay(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    log_decay: Tensor | None,
    initial_state: Tensor | None,
    options: dict[str, object],
    chunked: bool,
) -> tuple[Tensor, Tensor]:
    from fla.ops import gla, simple_gla

    # fla cumulates the log decays in their own dtype and takes (chunk_gla: only) a float32 state
    g = None if log_decay is None else log_decay.transpose(1, 2).float()
    options = {**options, "initial_state": None if initial_state is None else initial_state.float()}
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (b, n, h, d)
    if g is not None and g.dim() == 4:  # a decay per key channel
        if chunked:
            return gla.chunk_gla(q, k, v, g=g, **options)
        return gla.fused_recurrent_gla(q, k, v, gk=g, **options)
    op = simple_gla.chunk_simple_gla if chunked else simple_gla.fused_recurrent_simple_gla
    return op(q, k, v, g=g, **options)


def _delta(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    log_decay: Tensor | None,
    initial_state: Tensor | None,
    options: dict[str, object],
    chunk_length: int,
    chunked: bool,
) -> tuple[Tensor, Tensor]:
    options = {**options, "initial_state": initial_state}
    if chunked:
        options["chunk_size"] = chunk_length
    q, k, v, beta = (t.transpose(1, 2).contiguous() for t in (q, k, v, beta))  # (b, n, h, ...)
    if log_decay is None:
        from fla.ops.delta_rule import chunk_delta_rule, fused_recurrent_delta_rule

        op = chunk_delta_rule if chunked else fused_recurrent_delta_rule
        return op(q, k, v, beta, **options)
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

    g = log_decay.transpose(1, 2).contiguous()
    if chunked:
        return chunk_gated_delta_rule(q, k, v, g, beta, **options)  # g before beta here
    return fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, **options)
