"""Fidelity of approximate attention: ||out - out_ref||_F / ||out_ref||_F of a backend's core
against the dense reference (`full`; `shared-qk` for shared-QK cores) on the same seeded q, k, v,
causal flag and options (no key padding mask: bench cases have none), for each input family."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ..attention.spec import BACKENDS, build_attention, get_backend
from .cases import DECODE_MODES, DTYPES, BenchCase
from .metrics import FIDELITY_INPUTS, Metric, approx_error_name, metric_row
from .predict import predict_case
from .validate import dense_reference

FIDELITY_SEED = 0  # inputs and any random state of the backend (LSH rotations without a seed)
PEAK_GROUP = 4  # peaked inputs: tokens per group of mutually matching queries and keys
PEAK_NORM = 2.0  # peaked inputs: |q|, |k| in units of sqrt(head_dim) (a Gaussian vector's is 1)
PEAK_NOISE = 0.1  # peaked inputs: independent noise relative to the group's direction
NOT_MEASURED = "approx_error not measured"  # how every note begins (the report finds them by it)

Shape = tuple[int, int, int, int]  # (b, h, n, d)


def random_inputs(shape: Shape, gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v i.i.d. standard Gaussian: scores of spread ~1, so attention is near uniform."""
    return tuple(torch.randn(shape, generator=gen) for _ in range(3))


def peaked_inputs(shape: Shape, gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """Sharp attention: each query matches the few keys of its group strongly, the rest weakly.

    The positions fall into groups of PEAK_GROUP tokens scattered at random over the sequence
    (a random permutation, so a group is not a window). Each group has a random unit direction u;
    a token's q and k are PEAK_NORM * sqrt(d) * (u + PEAK_NOISE * z / sqrt(d)) with independent
    Gaussian z for q and for k; v is standard Gaussian. A query's scaled score with its group's
    keys is ~PEAK_NORM^2 sqrt(d) (32 at d = 64), with any other key ~N(0, PEAK_NORM^4) (spread 4),
    so softmax puts nearly all weight on the group. Shared-QK cores take q as k (as always).
    """
    b, h, n, d = shape
    groups = math.ceil(n / PEAK_GROUP)
    directions = torch.nn.functional.normalize(torch.randn(b, h, groups, d, generator=gen), dim=-1)
    group_of = torch.argsort(torch.rand(b, h, n, generator=gen), dim=-1) % groups  # (b, h, n)
    centre = torch.gather(directions, 2, group_of.unsqueeze(-1).expand(b, h, n, d))
    scale = PEAK_NORM * math.sqrt(d)

    def near_centre() -> Tensor:
        return scale * (centre + PEAK_NOISE * torch.randn(shape, generator=gen) / math.sqrt(d))

    return near_centre(), near_centre(), torch.randn(shape, generator=gen)


INPUTS: dict[str, Callable[[Shape, torch.Generator], tuple[Tensor, Tensor, Tensor]]] = {
    "random": random_inputs,
    "peaked": peaked_inputs,
}
if tuple(INPUTS) != FIDELITY_INPUTS:
    raise RuntimeError(f"fidelity inputs {tuple(INPUTS)} differ from the catalogue's")


def relative_error(out: Tensor, ref: Tensor) -> float:
    """||out - ref||_F / ||ref||_F, computed in float64."""
    out, ref = out.double(), ref.double()
    return float(torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref))


@dataclass(frozen=True, kw_only=True)
class Fidelity:
    """approx_error rows of one case, or a note saying why there are none."""

    rows: list[Metric] = field(default_factory=list)
    note: str | None = None


def is_approximate(case: BenchCase) -> bool:
    """True when some registered backend of the case computes something other than full softmax
    attention with the case's options: a pattern or an approximation. A recurrence is judged
    against its own recurrent form instead (an error against softmax would mean nothing)."""
    return any(
        name in BACKENDS
        and get_backend(name).caps_for(**_options(case, name)).kind in APPROXIMATING
        for name in case.backends()
    )


APPROXIMATING = ("pattern", "approximate")  # kinds whose approx_error against full is measured


def measure_fidelity(case: BenchCase, memory_limit_bytes: int | None = None) -> Fidelity:
    """approx_error of each input family for an approximate backend's core, at the case's core
    shapes (b, h, n, d), dtype, device, causal flag and options (the block's core for target
    block). Not measured (a note says why) for model cases, or when the reference is predicted
    to exceed the memory limit (CPU: the run's; CUDA: the free device memory). Exact backends
    and peers, and prefill/decode cases (the forward's error is theirs): nothing, silently."""
    if not is_approximate(case):
        return Fidelity()
    if case.target == "model":
        return Fidelity(
            note=f"{NOT_MEASURED}: model cases are not compared (measure target attention or block)"
        )
    if case.mode in DECODE_MODES:  # the same mechanism as its forward, whose error it shares
        return Fidelity()
    reference, ref_options = dense_reference(get_backend(case.backend).layout(**case.options))
    # the case's core shapes, dtype, device and causal flag, through the reference's forward
    ref_case = dataclasses.replace(
        case, target="attention", backend=reference, options=ref_options, mode="forward"
    )
    try:
        limit = _limit(case.device, memory_limit_bytes)
        if limit is not None:  # the reference's memory is predicted only where a limit bounds it
            needed = predict_case(ref_case).total_bytes + _output_bytes(case)
            if needed > limit:
                return Fidelity(
                    note=f"{NOT_MEASURED}: {ref_case.backend} (the reference) is predicted "
                    f"to need {needed / 2**20:.1f} MiB > limit {limit / 2**20:.1f} MiB"
                )
        return Fidelity(rows=_measure(case, ref_case.backend, ref_options))
    except Exception as exc:  # a failed comparison is a note, never a crashed case
        return Fidelity(note=f"{NOT_MEASURED}: {type(exc).__name__}: {exc}")


def _measure(case: BenchCase, reference: str, ref_options: dict[str, Any]) -> list[Metric]:
    device, dtype = torch.device(case.device), DTYPES[case.dtype]
    shape = (case.batch, case.num_heads, case.seq_len, case.head_dim)
    layout = get_backend(case.backend).layout(**case.options)
    kv = layout.kv_heads_for(case.num_heads)  # shared KV heads: the first ones of each family
    rows = []
    for index, family in enumerate(FIDELITY_INPUTS):
        gen = torch.Generator().manual_seed(FIDELITY_SEED + index)
        q, k, v = INPUTS[family](shape, gen)
        # the backend's extra inputs (gates, decays): drawn as the bench draws them
        extras = layout.sample_extras(q, generator=gen)
        q, k, v = (t.to(device=device, dtype=dtype) for t in (q, k, v))
        extras = {name: t.to(device=device, dtype=dtype) for name, t in extras.items()}
        k, v = (q if layout.shared_qk else k[:, :kv]), v[:, :kv]
        outputs = []
        for name, options, extra in (
            (case.backend, case.options, extras),
            (reference, ref_options, {}),
        ):
            # seeded global RNG: a backend drawing its randomness there (lsh without a seed) is
            # deterministic too, and the caller's RNG stream is left as it was
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                torch.manual_seed(FIDELITY_SEED)
                core = build_attention(name, causal=case.causal, device=device.type, **options)
                core = core.to(device=device, dtype=dtype).eval()
                with torch.no_grad():
                    outputs.append(core(q, k, v, **extra))
        rows.append(metric_row(approx_error_name(family), relative_error(*outputs)))
    return rows


def _options(case: BenchCase, name: str) -> dict:
    if case.target == "model":
        return dict((case.model.get("attn_options") or {}).get(name, {}))
    return dict(case.options)


def _output_bytes(case: BenchCase) -> int:
    """The approximation's output, kept while the reference runs."""
    itemsize = DTYPES[case.dtype].itemsize
    return case.batch * case.num_heads * case.seq_len * case.head_dim * itemsize


def _limit(device: str, memory_limit_bytes: int | None) -> int | None:
    if torch.device(device).type == "cuda":
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return free
    return memory_limit_bytes
