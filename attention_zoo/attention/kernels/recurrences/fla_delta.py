"""The delta rule and Gated DeltaNet through fla's Triton kernels (flash-linear-attention,
`fla.ops.delta_rule`, `fla.ops.gated_delta_rule`) on CUDA: our (b, h, n, d) layout converted to
fla's (b, n, h, d), keys and queries L2-normalised in the kernel where asked, the final state
returned (float32). fla is imported only where it runs."""

from __future__ import annotations

from torch import Tensor


def fla_chunk_delta(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    log_decay: Tensor | None = None,
    *,
    scale: float,
    chunk_length: int = 64,
    initial_state: Tensor | None = None,
    normalise_qk: bool = False,
) -> tuple[Tensor, Tensor]:
    """chunk_delta through fla's chunked kernels (training: they have a backward); chunk_length
    16, 32 or 64. fla's delta rule without decay takes 16-bit inputs only."""
    options = {**_options(scale, initial_state, normalise_qk), "chunk_size": chunk_length}
    if log_decay is None:
        from fla.ops.delta_rule import chunk_delta_rule

        o, state = chunk_delta_rule(*_fla_layout(q, k, v, beta), **options)
    else:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        q, k, v, beta, g = _fla_layout(q, k, v, beta, log_decay)
        o, state = chunk_gated_delta_rule(q, k, v, g, beta, **options)  # g before beta here
    return o.transpose(1, 2), state


def fla_recurrent_delta(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    log_decay: Tensor | None = None,
    *,
    scale: float,
    chunk_length: int = 64,
    initial_state: Tensor | None = None,
    normalise_qk: bool = False,
) -> tuple[Tensor, Tensor]:
    """chunk_delta through fla's token-by-token kernels (decoding a few tokens from a state;
    chunk_length is unused). The gated kernel has no backward."""
    options = _options(scale, initial_state, normalise_qk)
    if log_decay is None:
        from fla.ops.delta_rule import fused_recurrent_delta_rule

        o, state = fused_recurrent_delta_rule(*_fla_layout(q, k, v, beta), **options)
    else:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

        q, k, v, beta, g = _fla_layout(q, k, v, beta, log_decay)
        o, state = fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, **options)
    return o.transpose(1, 2), state


def _options(scale: float, initial_state: Tensor | None, normalise_qk: bool) -> dict[str, object]:
    """What every fla delta-rule call takes alike: the final state returned."""
    return {
        "scale": scale,
        "initial_state": initial_state,
        "output_final_state": True,
        "use_qk_l2norm_in_kernel": normalise_qk,
    }


def _fla_layout(*ts: Tensor) -> list[Tensor]:
    """(b, h, n, ...) -> contiguous (b, n, h, ...), fla's layout."""
    return [t.transpose(1, 2).contiguous() for t in ts]
