"""Check a built case's output before any of its numbers is stored: the contract's shape and dtype,
finite values from finite inputs, and for an exact backend agreement with its dense reference at a
small size. A case that fails is stored as `invalid`, never as a time to rank.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..attention.inputs import InputLayout
from ..attention.spec import RunTarget, build_attention, get_backend
from .cases import CLASSIFIER_LABELS, DTYPES, BenchCase, Runnable
from .peers import is_peer

# The reference check's size: small enough to cost nothing, long enough that chunked kernels pad
# (48 is no multiple of their chunk lengths) and several blocks of a kernel are compared.
CHECK_SHAPE = (1, 2, 48)  # (b, h, n); d is the case's head_dim
# |out - ref| <= tol + tol * |ref| per dtype: float64 leaves only summation order (~1e-15); the
# others allow a few units of their rounding at this length.
TOLERANCE = {"float64": 1e-6, "float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}
CHECK_DTYPES = ("float64", "float32")  # the most exact dtype the backend runs, then the case's


def dense_reference(layout: InputLayout) -> tuple[str, dict[str, Any]]:
    """The dense backend (and its options) an exact core must equal and an approximate one is
    measured against (approx_error): shared-qk for shared-QK cores, else full with the same
    shared KV heads."""
    if layout.shared_qk:
        return "shared-qk", {}
    return "full", {} if layout.kv_heads is None else {"kv_heads": layout.kv_heads}


def expected_output(case: BenchCase) -> tuple[tuple[int, ...], torch.dtype]:
    """The shape and dtype a case's forward must return: (b, h, n, d) like q for an attention
    core, (b, n, hidden) for a block, (b, n, vocab) logits for a model ((b, classes) when not
    causal); the case's dtype."""
    if case.target == "attention":
        n = 1 if case.mode == "decode" else case.seq_len  # decode: one new token
        d_v = case.head_dim * get_backend(case.backend).layout(**case.options).expand_v
        shape: tuple[int, ...] = (case.batch, case.num_heads, n, d_v)
    elif case.target == "block":
        shape = (case.batch, case.seq_len, case.hidden)
    elif case.causal:
        shape = (case.batch, case.seq_len, case.reformer_config().vocab_size)
    else:  # a bidirectional model is measured as a sequence classifier
        shape = (case.batch, CLASSIFIER_LABELS)
    return shape, DTYPES[case.dtype]


def invalid_output(runnable: Runnable) -> str | None:
    """Why the case's output breaks the contract, or None: one forward on the case's inputs,
    with autograd where the step has a backward (a compiled kernel is then the step's own, not
    a forward-only one compiled for the check)."""
    case = runnable.case
    with torch.set_grad_enabled(case.mode in ("forward+backward", "train-step")):
        out = runnable.output()
    out = out.detach() if isinstance(out, Tensor) else out
    shape, dtype = expected_output(case)
    if not isinstance(out, Tensor):
        return f"the {case.target} returned {type(out).__name__}, not a tensor"
    if tuple(out.shape) != shape:
        return (
            f"the {case.target} returned shape {tuple(out.shape)}, the contract says {shape} "
            f"({_shape_names(case)})"
        )
    if out.dtype != dtype:
        return f"the {case.target} returned dtype {out.dtype} for {case.dtype} inputs"
    inputs_finite = all(
        bool(t.isfinite().all()) for t in runnable.inputs if t.dtype.is_floating_point
    )
    if inputs_finite and not bool(out.isfinite().all()):
        bad = int((~out.isfinite()).sum())
        return f"{bad} of {out.numel()} output values are NaN or infinite (the inputs were finite)"
    return None


def _shape_names(case: BenchCase) -> str:
    return {
        "attention": "batch, heads, length, head_dim, like q",
        "block": "batch, length, hidden",
        "model": "batch, length, vocab_size" if case.causal else "batch, classes",
    }[case.target]


def disagreement(case: BenchCase) -> str | None:
    """Why an exact backend of the case does not equal its dense reference at CHECK_SHAPE, or
    None (approximate backends and peers are not compared; fidelity is measured elsewhere).

    Compared in the most exact dtype both run with the case's options (a dtype that fails to run
    gives way to the next), and also in the case's own dtype, with its tolerance, when that is
    neither float64 nor the dtype already compared: a kernel may take another path there."""
    for name, options in _cores(case):
        spec = get_backend(name)
        caps, layout = spec.caps_for(**options), spec.layout(**options)
        reference = dense_reference(layout)
        if not caps.exact or name == reference[0]:
            continue
        candidates = _check_dtypes(name, options, case)
        if not candidates:
            continue
        checked, failure = None, None
        for dtype in candidates:
            try:
                failure = _compare(name, options, reference, case, dtype)
            except Exception:
                if dtype == candidates[-1]:
                    raise  # no dtype ran: check_case says the check was not run, and why
                continue
            checked = dtype
            break
        if failure is None and checked not in ("float64", case.dtype):
            failure = _compare(name, options, reference, case, case.dtype)
        if failure:
            return failure
    return None


def _compare(
    name: str,
    options: dict[str, Any],
    reference: tuple[str, dict[str, Any]],
    case: BenchCase,
    dtype: str,
) -> str | None:
    """Why the core's output differs from the reference's at CHECK_SHAPE in `dtype`, or None."""
    got = _core_output(name, options, case, dtype)
    want = _core_output(*reference, case, dtype)
    tol = TOLERANCE[dtype]
    if got.shape != want.shape:
        return f"exact backend {name!r} returned shape {tuple(got.shape)} at a small size"
    err = (got - want).abs()
    if not bool((err <= tol + tol * want.abs()).all()):
        return (
            f"exact backend {name!r} disagrees with {reference[0]!r} at n={CHECK_SHAPE[2]} "
            f"({dtype}): max |difference| {err.max().item():.3g}, tolerance {tol:g}"
        )
    return None


def _cores(case: BenchCase) -> list[tuple[str, dict[str, Any]]]:
    """Our registered cores the case runs, each with the options it runs them with."""
    per_layer = case.model.get("attn_options", {}) if case.target == "model" else {}
    out = []
    for name in case.backends():
        if is_peer(name):
            continue
        options = {**per_layer.get(name, {}), **(case.options if name == case.backend else {})}
        out.append((name, options))
    return out


def _check_dtypes(name: str, options: dict[str, Any], case: BenchCase) -> list[str]:
    """The dtypes to try the reference check in, most exact first: those the core declares with
    the case's options (a config may narrow them, e.g. a flash kernel) on the case's device."""
    spec = get_backend(name)
    dtypes = spec.caps_for(**options).dtypes
    device = torch.device(case.device).type
    out = []
    for dtype in dict.fromkeys((*CHECK_DTYPES, case.dtype)):
        probe = RunTarget(device=device, dtype=dtype, causal=case.causal)
        if dtype in dtypes and not spec.unsupported(probe):
            out.append(dtype)
    return out


def _core_output(name: str, options: dict[str, Any], case: BenchCase, dtype: str) -> Tensor:
    """The core's output at CHECK_SHAPE (the case's heads under shared KV heads, which must
    divide them) on seeded inputs of its layout (the same for cores of one layout), in float64."""
    b, h, n = CHECK_SHAPE
    layout = get_backend(name).layout(**options)
    h = h if layout.kv_heads is None else case.num_heads
    generator = torch.Generator().manual_seed(0)
    x = layout.sample(b, h, n, case.head_dim, generator=generator)
    core = build_attention(
        name, causal=case.causal, device=torch.device(case.device).type, **options
    )
    core = core.to(device=case.device, dtype=DTYPES[dtype]).eval()
    with torch.no_grad():
        q, k, v = (t.to(device=case.device, dtype=DTYPES[dtype]) for t in (x.q, x.k, x.v))
        extras = {key: t.to(device=case.device, dtype=DTYPES[dtype]) for key, t in x.extras.items()}
        return core(q, k, v, **extras).double().cpu()


def check_case(runnable: Runnable) -> tuple[str | None, str | None]:
    """(why the case is invalid or None, a note when the reference check could not run)."""
    if reason := invalid_output(runnable):
        return reason, None
    try:
        return disagreement(runnable.case), None
    except Exception as exc:  # the small size failed where the case's own size ran: say so
        return None, f"reference check not run: {type(exc).__name__}: {exc}"
