"""The numbers a fair comparison holds fixed: parameters per block, decoding state bytes per
sequence and forward FLOPs per token, computed (never measured) for any backend at a setting, on
the meta device, so they cost no memory and no hardware."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..attention import decode
from ..attention.dispatch import AUTO
from ..attention.recurrent import RecurrenceConfig
from ..attention.spec import BackendSpec, build_attention, get_backend
from ..blocks.attention import SelfAttention
from ..errors import ShapeError, ZooError
from .cases import DTYPES, BenchCase
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


# Forward FLOPs are counted on the meta device, where a recurrence's Python loop over chunks costs
# time per chunk (seconds at 64k positions, hours near 2**31). A recurrence's state has one size
# at any length, so past COUNTED_UP_TO positions its count is extended instead: counted at three
# lengths PERIOD apart with the context's remainder, a line through two of them checked on the
# third. PERIOD is a multiple of every chunk this applies to (powers of two up to it), and the
# samples start at SAMPLED_FROM, where the kernels' segments are as long as at any length.
COUNTED_UP_TO = 1 << 16
PERIOD = 1 << 12
SAMPLED_FROM = 4 * PERIOD


def forward_flops(case: BenchCase) -> int:
    """FLOPs of `case`'s step as predict_flops counts them; for a recurrence past COUNTED_UP_TO
    positions, read off the line through counts at shorter lengths where a third count confirms
    it (else counted directly)."""
    n = case.seq_len
    if n <= COUNTED_UP_TO or not _extensible(case):
        return predict_flops(case)
    first = SAMPLED_FROM + n % PERIOD
    counts = [predict_flops(case.replace(seq_len=first + i * PERIOD)) for i in range(3)]
    step = counts[1] - counts[0]
    if counts[2] - counts[1] != step:  # not one cost per PERIOD: count it all
        return predict_flops(case)
    return counts[0] + (n - first) // PERIOD * step


def _extensible(case: BenchCase) -> bool:
    """Whether forward_flops may extend the case's count: a recurrence whose chunks divide PERIOD
    (a longer chunk is few chunks, counted directly in moments)."""
    cfg = get_backend(case.backend).make_config(**case.options)
    return isinstance(cfg, RecurrenceConfig) and cfg.chunk_length <= PERIOD


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
    """The options with the plain PyTorch implementation ("math") where the backend has one and
    none is named: the mechanism's matmuls, counted in a few large ops rather than a fused
    kernel's many small ones (a segment loop costs seconds even on the meta device)."""
    table = getattr(spec.cls, "kernels", None)
    named = options.get("kernel", AUTO) != AUTO
    if named or table is None or "math" not in table.by_name or "kernel" not in spec.defaults():
        return dict(options)
    return {**options, "kernel": "math"}


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
