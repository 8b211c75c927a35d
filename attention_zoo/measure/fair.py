"""The numbers a fair comparison holds fixed: parameters per block, decoding state bytes per
sequence and forward FLOPs per token, computed (never measured) for any backend at a setting, on
the meta device, so they cost no memory and no hardware."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import torch

from ..attention import decode
from ..attention.base import AttentionCore
from ..attention.dispatch import AUTO
from ..attention.recurrent import RecurrenceConfig
from ..attention.spec import BackendSpec, build_attention, get_backend
from ..blocks.attention import SelfAttention
from ..errors import ShapeError, ZooError
from .cases import DTYPES, BenchCase
from .kernels import attention_cores, idle_ids
from .metrics import Metric, metric_row
from .peers import is_peer
from .predict import predict_flops


@dataclass(frozen=True, kw_only=True)
class FairSetting:
    """Where the numbers are computed: a block of `heads` heads of `head_dim` (hidden = their
    product), one sequence of `context` positions."""

    heads: int = 4
    head_dim: int = 64
    context: int = 4096
    dtype: str = "float32"

    @classmethod
    def of(cls, case: BenchCase) -> FairSetting:
        """The setting of a measured case (its context: the prompt and the new tokens)."""
        n = case.seq_len + case.new_tokens
        return cls(heads=case.num_heads, head_dim=case.head_dim, context=n, dtype=case.dtype)


@dataclass(frozen=True, kw_only=True)
class FairNumbers:
    """One backend's fair-comparison numbers at a setting."""

    params: int  # parameters of one attention block (projections and the core's own)
    state_bytes: int | None  # decoding state of one sequence at the context; None: cannot decode
    flops_per_token: float  # one block's causal (else bidirectional) forward, per position, as
    # its plain implementation computes it (the same matmuls as its fused kernels)

    def to_dict(self) -> dict[str, Any]:
        return {
            "params": self.params,
            "state_bytes": self.state_bytes,
            "flops_per_token": self.flops_per_token,
        }


def fair_numbers(backend: str, options: dict[str, Any], setting: FairSetting) -> FairNumbers:
    """The three numbers of `backend` with `options` at `setting`."""
    spec = get_backend(backend)
    causal = spec.caps_for(**options).causal
    h, d, n = setting.heads, setting.head_dim, setting.context
    with torch.device("meta"):
        block = SelfAttention(h * d, h, backend, causal=causal, device="meta", **options)
    params = sum(p.numel() for p in block.parameters())
    case = BenchCase(
        target="block",
        backend=backend,
        options=_plain(spec, options),
        seq_len=n,
        num_heads=h,
        head_dim=d,
        hidden=h * d,
        causal=causal,
        dtype=setting.dtype,
    )
    try:
        flops = forward_flops(case)
        state_bytes = _state_bytes(backend, options, setting)
    except RuntimeError as err:
        if "overflow" not in str(err):
            raise
        # n x n scores past int64 sizes (from ~2**30 positions): not even meta tensors hold them
        raise ShapeError(f"{backend} at {n} positions is too large to count: {err}") from None
    return FairNumbers(params=params, state_bytes=state_bytes, flops_per_token=flops / n)


# Forward FLOPs are counted on the meta device, where a kernel's Python loop over chunks or tiles
# costs time per iteration (seconds at 64k positions, hours near 2**31). Where the count is known
# to be a polynomial in the length over lengths PERIOD apart (a recurrence's a line, a routed
# backend's a quadratic), past COUNTED_UP_TO positions it is extended instead: counted at lengths
# PERIOD apart with the context's remainder, one more than the polynomial needs to check it. The
# samples start at SAMPLED_FROM, where the kernels' segments are as long as at any length (later
# for a routed core whose routes settle later).
COUNTED_UP_TO = 1 << 16
PERIOD = 1 << 12
SAMPLED_FROM = 4 * PERIOD


def forward_flops(case: BenchCase) -> int:
    """FLOPs of `case`'s step as predict_flops counts them; past COUNTED_UP_TO positions, where
    the count is a polynomial in the length, from the polynomial through counts at shorter
    lengths that one more count confirms (else counted directly)."""
    n = case.seq_len
    if n <= COUNTED_UP_TO or (plan := _polynomial(case)) is None:
        return predict_flops(case)
    degree, first = plan
    counts = [predict_flops(case.replace(seq_len=first + i * PERIOD)) for i in range(degree + 2)]
    differences = [counts]  # Newton's forward differences: the j-th of them at `first`
    while len(differences[-1]) > 1:
        row = differences[-1]
        differences.append([b - a for a, b in itertools.pairwise(row)])
    if differences[-1][0] != 0:  # not that polynomial: count it all
        return predict_flops(case)
    steps = (n - first) // PERIOD
    return sum(math.comb(steps, j) * row[0] for j, row in enumerate(differences[:-1]))


def _polynomial(case: BenchCase) -> tuple[int, int] | None:
    """(degree, first sample) of the polynomial the case's count follows over lengths PERIOD
    apart: 1 for a recurrence whose chunks divide PERIOD (one state at any length); 2 for block
    routing on its tiles (each query scores every block) from where `_routes_settled`."""
    spec = get_backend(case.backend)
    cfg = spec.make_config(**case.options)
    first = SAMPLED_FROM + case.seq_len % PERIOD
    if isinstance(cfg, RecurrenceConfig):
        return (1, first) if PERIOD % cfg.chunk_length == 0 else None
    core = spec.cls(cfg, causal=True)
    if not hasattr(core, "route_shape"):
        return None
    while first + 3 * PERIOD <= case.seq_len:  # a quadratic's four samples fit before the context
        if _routes_settled(core, case, first):
            return 2, first
        first = 2 * first - case.seq_len % PERIOD  # twice as far, the same remainder
    return None


def _routes_settled(core: AttentionCore, case: BenchCase, first: int) -> bool:
    """Whether a routed core runs its plain implementation (its tiles) the same way from `first`
    to the case's length: blocks dividing PERIOD, every query's route full (as many blocks as it
    has slots), and no inner core run besides the tiles (nsa's window joins them from a length
    on, never to leave: checked at both ends)."""
    slots, block = core.route_shape()
    if core.cfg.kernel != core.kernels.plain or PERIOD % block or first < slots * block:
        return False
    for length in (first, case.seq_len):
        idle = idle_ids(case.replace(seq_len=length), [core])
        if any(id(c) not in idle for c in attention_cores(core) if c is not core):
            return False
    return True


FAIR_TARGETS = ("attention", "block")  # a model's layers may mix backends: no one block to count


def fair_rows(case: BenchCase, metrics: tuple[str, ...] | list[str]) -> list[Metric]:
    """The case's fair-comparison numbers as stored rows, at its own setting: the block's
    parameters and the state's bytes (`predict`), FLOPs per token (`flops`); none for a model
    or a peer, or where they cannot be computed."""
    if case.target not in FAIR_TARGETS or is_peer(case.backend):
        return []
    if not {"predict", "flops"} & set(metrics):
        return []
    try:
        numbers = fair_numbers(case.backend, case.options, FairSetting.of(case))
    except (ZooError, TypeError, NotImplementedError):
        return []
    rows = []
    if "predict" in metrics:
        rows.append(metric_row("block_parameters", numbers.params))
        if numbers.state_bytes is not None:
            rows.append(metric_row("state_bytes_per_sequence", numbers.state_bytes))
    if "flops" in metrics:
        rows.append(metric_row("flops_per_token", numbers.flops_per_token))
    return rows


def _plain(spec: BackendSpec, options: dict[str, Any]) -> dict[str, Any]:
    """The options with the table's plain implementation where the backend has one and none is
    named: the mechanism's own products, counted in a few large ops rather than a fused kernel's
    many small ones (a segment loop costs seconds even on the meta device)."""
    table = getattr(spec.cls, "kernels", None)
    named = options.get("kernel", AUTO) != AUTO
    plain = getattr(table, "plain", None)
    if named or table is None or plain not in table.by_name or "kernel" not in spec.defaults():
        return dict(options)
    return {**options, "kernel": plain}


def _state_bytes(backend: str, options: dict[str, Any], setting: FairSetting) -> int | None:
    """Bytes of the state after `context` positions (its own state, else the recomputed prefix):
    built on the meta device, so any context costs nothing."""
    spec = get_backend(backend)
    if decode.decoding_of(spec, **options) == decode.NONE:
        return None
    core = build_attention(backend, causal=True, device="meta", **options)
    layout = core.layout
    h, d = setting.heads, setting.head_dim
    shape = decode.StateShape(
        1,
        h,
        d,
        setting.context,
        DTYPES[setting.dtype],
        "meta",
        layout.kv_heads_for(h),
        d * layout.expand_v,
    )
    return decode.init_state(core, shape).nbytes()
