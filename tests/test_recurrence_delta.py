"""The delta rule in chunks (DeltaNet, Gated DeltaNet) against the token-by-token recurrence:
outputs, final states and every gradient; prefill then decode; our reference against fla's naive
ones; fla's Triton kernels against the chunks on CUDA."""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import torch
from torch.nn import functional as F

from attention_zoo.attention.kernels.recurrences import delta
from attention_zoo.attention.kernels.recurrences.delta import chunk_delta
from attention_zoo.attention.kernels.recurrences.fla import fla_recurrence
from attention_zoo.attention.kernels.recurrences.reference import recurrence
from attention_zoo.attention.kernels.recurrences.table import RecurrenceInputs
from attention_zoo.measure.flops import count_flops

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "scripts"))
import recurrence_targets

fla_chunk_delta = partial(fla_recurrence, chunked=True)
fla_recurrent_delta = partial(fla_recurrence, chunked=False)

B, H, DK, DV = 2, 3, 8, 6


def _inputs(
    n: int, *, decay: bool, beta_max: float = 1.0, dtype=torch.float64, state: bool = True, seed=0
) -> dict[str, torch.Tensor | None]:
    """L2-normalised keys (the delta rule is stable for |k| = 1, beta in (0, 2)), beta a sigmoid
    times beta_max, log decays a log-sigmoid (<= 0)."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    x = {
        "q": randn(B, H, n, DK),
        "k": F.normalize(randn(B, H, n, DK), dim=-1),
        "v": randn(B, H, n, DV),
        "beta": beta_max * randn(B, H, n).sigmoid(),
        "log_decay": F.logsigmoid(randn(B, H, n) + 2) if decay else None,
        "initial_state": randn(B, H, DK, DV) if state else None,
    }
    return {name: None if t is None else t.to(dtype).requires_grad_() for name, t in x.items()}


def _leaves(x: dict, dtype: torch.dtype, device: str = "cpu") -> dict:
    """The same inputs as new leaves of another dtype or device."""
    return {
        name: None if t is None else t.detach().to(device, dtype).requires_grad_()
        for name, t in x.items()
    }


def _chunked(x: dict, chunk_length: int, scale: float = 0.3, normalise_qk: bool = False):
    return chunk_delta(
        x["q"], x["k"], x["v"], x["beta"], x["log_decay"], scale=scale,
        chunk_length=chunk_length, initial_state=x["initial_state"], normalise_qk=normalise_qk,
    )  # fmt: skip


def _reference(x: dict, scale: float = 0.3, normalise_qk: bool = False):
    return recurrence(
        x["q"], x["k"], x["v"], log_decay=x["log_decay"], beta=x["beta"], scale=scale,
        initial_state=x["initial_state"], normalise_qk=normalise_qk,
    )  # fmt: skip


def _with_grads(fn, x: dict) -> list[torch.Tensor]:
    """Output, final state and the gradients of a fixed random loss on both, for every input."""
    o, state = fn()
    gen = torch.Generator().manual_seed(1)
    loss = (o * torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o)).sum()
    loss = (
        loss
        + (state * torch.randn(state.shape, generator=gen, dtype=torch.float64).to(state)).sum()
    )
    leaves = [t for t in x.values() if t is not None]
    return [o, state, *torch.autograd.grad(loss, leaves)]


def _assert_close_scaled(got: list, want: list, tol: float | list[float]) -> None:
    """Each tensor within tol (one for all, or one each) of its reference, relative to the
    reference's largest entry."""
    tols = tol if isinstance(tol, list) else [tol] * len(want)
    for i, (g, w, t) in enumerate(zip(got, want, tols, strict=True)):
        err = (g.double() - w.double()).abs().max() / w.double().abs().max().clamp(min=1e-30)
        assert err <= t, f"tensor {i}: relative error {err:.2e} > {t:.0e}"


@pytest.mark.parametrize("decay", [False, True], ids=["delta", "gated"])
@pytest.mark.parametrize("beta_max", [1.0, 2.0], ids=["beta01", "beta02"])
@pytest.mark.parametrize("n", [1, 5, 16, 45])
def test_chunks_match_the_recurrence_in_float64(decay, beta_max, n):
    """n < chunk, n = chunk, n not a multiple of it (padded), n = 1; with an initial state."""
    x = _inputs(n, decay=decay, beta_max=beta_max)
    got = _with_grads(lambda: _chunked(x, chunk_length=16), x)
    want = _with_grads(lambda: _reference(x), x)
    _assert_close_scaled(got, want, 1e-10)


@pytest.mark.parametrize("decay", [False, True], ids=["delta", "gated"])
def test_segments_match_the_recurrence(monkeypatch, decay):
    """A call longer than a segment: forward segment by segment, backward recomputing each."""
    monkeypatch.setattr(delta, "SEGMENT_LENGTH", 32)
    x = _inputs(70, decay=decay, beta_max=2.0)
    got = _with_grads(lambda: _chunked(x, chunk_length=16), x)
    _assert_close_scaled(got, _with_grads(lambda: _reference(x), x), 1e-10)


@pytest.mark.parametrize("n", [1, 20, 70], ids=["step", "one-segment", "segments"])
@pytest.mark.parametrize("decay", [False, True], ids=["delta", "gated"])
def test_normalising_qk_in_the_kernel_is_normalising_them_first(monkeypatch, decay, n):
    """Unnormalised q and k, L2-normalised inside the kernel: the recurrence over unit q and k,
    gradients taken through the normalisation, on every path (decode step, one segment, many)."""
    monkeypatch.setattr(delta, "SEGMENT_LENGTH", 32)
    x = _inputs(n, decay=decay, beta_max=2.0)
    with torch.no_grad():
        x["k"].mul_(3 * torch.rand(x["k"].shape[:-1], dtype=x["k"].dtype)[..., None] + 0.5)
    got = _with_grads(lambda: _chunked(x, chunk_length=16, normalise_qk=True), x)
    want = _with_grads(lambda: _reference(x, normalise_qk=True), x)
    _assert_close_scaled(got, want, 1e-10)
    unit = {**x, "q": F.normalize(x["q"], dim=-1), "k": F.normalize(x["k"], dim=-1)}
    _assert_close_scaled(got[:2], _with_grads(lambda: _reference(unit), x)[:2], 1e-10)


def test_normalising_qk_without_step_sizes_is_refused():
    """Only the delta rule's kernels normalise q and k: a decay-gated call asking for it fails."""
    x = _inputs(8, decay=True, beta_max=1.0)
    with pytest.raises(ValueError, match="delta rule's kernels only"):
        RecurrenceInputs(x["q"], x["k"], x["v"], x["log_decay"], None, 0.3, normalise_qk=True)


def test_normalising_in_the_kernel_keeps_no_normalised_copy(monkeypatch):
    """Across segments, autograd keeps the inputs themselves and per-segment states, never a
    whole-length normalised q or k."""
    monkeypatch.setattr(delta, "SEGMENT_LENGTH", 32)
    n = 128
    x = _inputs(n, decay=True, dtype=torch.float32, state=False)
    inputs = {t.data_ptr() for t in x.values() if t is not None}
    saved = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _chunked(x, chunk_length=16, normalise_qk=True)
    whole = [t for t in saved if t.numel() >= B * H * n]
    assert whole and all(t.data_ptr() in inputs for t in whole)


@pytest.mark.parametrize("decay", [False, True], ids=["delta", "gated"])
def test_chunks_match_the_recurrence_in_float32(decay):
    x = _inputs(100, decay=decay, beta_max=2.0, dtype=torch.float32, state=False)
    got = _with_grads(lambda: _chunked(x, chunk_length=32), x)
    x64 = _leaves(x, torch.float64)
    want = _with_grads(lambda: _reference(x64), x64)
    assert got[0].dtype == got[1].dtype == torch.float32
    _assert_close_scaled(got, want, 1e-5)


def test_a_decay_of_zero_resets_the_state(monkeypatch):
    """Log decays of -inf (a hard reset) inside chunks and on a segment's edge: as the
    recurrence, never -inf - -inf."""
    monkeypatch.setattr(delta, "SEGMENT_LENGTH", 32)
    x = _inputs(50, decay=True, beta_max=2.0)
    with torch.no_grad():
        x["log_decay"][:, :, [3, 16, 40]] = -torch.inf
    got = _with_grads(lambda: _chunked(x, chunk_length=8), x)
    assert all(t.isfinite().all() for t in got)
    _assert_close_scaled(got, _with_grads(lambda: _reference(x), x), 1e-10)


@pytest.mark.parametrize("decay", [False, True], ids=["delta", "gated"])
def test_no_tokens_give_no_output_and_the_state_unchanged(decay):
    x = _inputs(0, decay=decay)
    out, state = _chunked(x, chunk_length=16)
    assert out.shape == (B, H, 0, DV) and torch.equal(state, x["initial_state"])


def test_strong_decays_stay_exact():
    """Decays that underflow within a chunk (a chunk's total decay far below float32's range)."""
    x = _inputs(96, decay=True, dtype=torch.float32, state=False)
    with torch.no_grad():
        x["log_decay"].mul_(40).sub_(1)
    got = _with_grads(lambda: _chunked(x, chunk_length=64), x)
    assert all(t.isfinite().all() for t in got)
    x64 = _leaves(x, torch.float64)
    _assert_close_scaled(got, _with_grads(lambda: _reference(x64), x64), 1e-5)


@pytest.mark.parametrize("decay", [False, True], ids=["delta", "gated"])
def test_prefill_then_continue_is_the_whole_sequence(decay):
    """n1 tokens, then n2 more from the state, then token by token (decode steps, t = 1)."""
    x = _inputs(40, decay=decay, beta_max=2.0)
    whole, final = _chunked(x, chunk_length=8)

    def part(start: int, stop: int, state: torch.Tensor | None):
        cut = {
            name: None if t is None else t[:, :, start:stop] for name, t in x.items()
            if name != "initial_state"
        }  # fmt: skip
        cut["initial_state"] = state
        return _chunked(cut, chunk_length=8)

    first, state = part(0, 29, x["initial_state"])
    second, state = part(29, 35, state)
    steps = []
    for t in range(35, 40):
        out, state = part(t, t + 1, state)
        steps.append(out)
    _assert_close_scaled([torch.cat([first, second, *steps], dim=2), state], [whole, final], 1e-12)


@pytest.mark.parametrize("decay", [False, True], ids=["delta", "gated"])
def test_the_decode_step_is_the_one_token_chunk(decay):
    """chunk_delta takes its one-token step for one token: the same as the chunked form of
    length 1, its hand-written backward included."""
    x = _inputs(1, decay=decay, beta_max=2.0)
    inputs = (x["q"], x["k"], x["v"], x["beta"], x["log_decay"], x["initial_state"])
    got = _with_grads(lambda: delta._step(inputs, 0.3, False), x)
    setup, bounds = (0.3, 64, False), [(0, 1)]
    want = _with_grads(lambda: delta._Segments.apply(*inputs, setup, bounds), x)
    _assert_close_scaled(got, want, 1e-12)


def test_a_decode_step_costs_a_few_state_products():
    """One token against a state: O(dk dv) FLOPs per head, no chunk-sized work, either way."""
    x = _inputs(1, decay=True, dtype=torch.float32)
    _, flops = count_flops(lambda: _chunked(x, chunk_length=64))
    assert flops <= 6 * B * H * DK * DV
    args = (x["q"], x["k"], x["v"], x["beta"], x["log_decay"], x["initial_state"], 0.3, 64)
    with torch.no_grad():  # the chunks' forward (`_Segments` differentiates it by hand)
        _, flops = count_flops(lambda: delta._segment(*args))
    assert flops <= 8 * B * H * DK * DV


def test_16bit_inputs_compute_in_float32():
    x = _inputs(50, decay=True, dtype=torch.bfloat16, state=False)
    o, state = _chunked(x, chunk_length=16)
    assert o.dtype == torch.bfloat16 and state.dtype == torch.float32
    x32 = {name: None if t is None else t.detach().float() for name, t in x.items()}
    o32, state32 = _chunked(x32, chunk_length=16)
    assert torch.equal(o, o32.to(torch.bfloat16))  # rounded once, at the end
    assert torch.equal(state, state32)


def test_backward_keeps_no_per_token_state():
    """Autograd saves nothing of n x dk x dv size: per-chunk states only."""
    n = 256
    x = _inputs(n, decay=True, dtype=torch.float32, state=False)
    sizes = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _chunked(x, chunk_length=16)
    assert max(sizes) <= B * H * n * max(16, DK, DV)  # n x c or n x d, not n x dk x dv


@pytest.mark.parametrize("chunk", [8, 16])
def test_the_forward_keeps_the_state_entering_every_other_chunk(monkeypatch, chunk):
    """ceil(nc / 2) states per segment (4, 2 or 1 chunks in a segment here), each in its own
    storage: not a view that would hold the carry's buffer of every chunk's state."""
    monkeypatch.setattr(delta, "SEGMENT_LENGTH", 32)
    x = _inputs(70, decay=True, dtype=torch.float32, state=False)
    kept = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.shape[-2:] == (DK, DV):
            kept.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _chunked(x, chunk_length=chunk)
    per_segment = [-(-min(32, 70 - s) // chunk) for s in range(0, 70, 32)]
    assert [t.shape[0] for t in kept] == [-(-nc // 2) for nc in per_segment]
    assert all(t.untyped_storage().nbytes() == t.numel() * t.element_size() for t in kept)


@pytest.mark.parametrize("decay", [False, True], ids=["delta", "gated"])
def test_16bit_backward_computes_in_float32(monkeypatch, decay):
    """Across segments: gradients in the inputs' dtype, each that of the float32 call rounded."""
    monkeypatch.setattr(delta, "SEGMENT_LENGTH", 32)
    x = _inputs(70, decay=decay, beta_max=2.0, dtype=torch.bfloat16)
    got = _with_grads(lambda: _chunked(x, chunk_length=16, normalise_qk=True), x)
    x32 = _leaves(x, torch.float32)
    want = _with_grads(lambda: _chunked(x32, chunk_length=16, normalise_qk=True), x32)
    assert [t.dtype for t in got[2:]] == [t.dtype for t in x.values() if t is not None]
    _assert_close_scaled(got, want, 2e-2)  # bfloat16 keeps 8 bits


def test_long_calls_run_segments_of_twice_the_length(monkeypatch):
    """From 32 segment lengths on, segments of twice the length: the same results."""
    monkeypatch.setattr(delta, "SEGMENT_LENGTH", 8)
    assert delta.segments(300, 4, delta._segment_length(300))[1] == (16, 32)
    x = _inputs(300, decay=True, beta_max=2.0)
    got = _with_grads(lambda: _chunked(x, chunk_length=4, normalise_qk=True), x)
    want = _with_grads(lambda: _reference(x, normalise_qk=True), x)
    _assert_close_scaled(got, want, 1e-10)


def test_forward_flops_count_the_triangular_solve(monkeypatch):
    """Its FLOPs: m^2 r per (m x m) system with r right-hand sides, half a matmul's 2 m^2 r; the
    chunks invert their (16 x 16) systems, r = 16."""
    from torch.utils import flop_counter

    x = _inputs(64, decay=False, dtype=torch.float32, state=False)
    _, counted = count_flops(lambda: _chunked(x, chunk_length=16))
    monkeypatch.delitem(flop_counter.flop_registry, torch.ops.aten.linalg_solve_triangular)
    _, without = count_flops(lambda: _chunked(x, chunk_length=16))
    chunks = B * H * 64 // 16
    assert counted - without == chunks * 16 * 16 * 16


# fla's naive references: (b, h, n, d) for the delta rule, (b, n, h, d) for the gated one; they
# normalise nothing, and fix the scale at dk^-0.5 (delta rule) or default to it.


def _fla_naive(family: str) -> ModuleType:
    """fla.ops.<family>.naive loaded alone (recurrence_targets.fla_naive); skips without fla."""
    module = recurrence_targets.fla_naive(family)
    if module is None:
        pytest.skip("fla is not installed")
    return module


def _fla_inputs(n: int, *, decay: bool) -> dict:
    x = _inputs(n, decay=decay, dtype=torch.float32)
    return {name: None if t is None else t.detach() for name, t in x.items()}


def test_reference_matches_fla_delta_rule_recurrence():
    naive = _fla_naive("delta_rule")
    x = _fla_inputs(37, decay=False)
    want, want_state = naive.delta_rule_recurrence(
        x["q"], x["k"], x["v"], x["beta"], initial_state=x["initial_state"]
    )
    got = _reference(x, scale=DK**-0.5)
    _assert_close_scaled(list(got), [want, want_state], 1e-4)
    # fla's chunked form takes whole chunks and no initial state
    first = [x[name][:, :, :32] for name in ("q", "k", "v", "beta")]
    chunked = naive.delta_rule_chunkwise(*first, chunk_size=8)[0]
    ours = chunk_delta(*first, scale=DK**-0.5, chunk_length=16)[0]
    _assert_close_scaled([ours], [chunked], 1e-4)


@pytest.mark.parametrize("kind", ["recurrent", "chunk"])
def test_reference_matches_fla_gated_delta_rule(kind):
    naive = _fla_naive("gated_delta_rule")
    x = _fla_inputs(45, decay=True)
    q, k, v, beta, g = (x[name].transpose(1, 2) for name in ("q", "k", "v", "beta", "log_decay"))
    common = {"scale": 0.3, "initial_state": x["initial_state"], "output_final_state": True}
    if kind == "recurrent":
        want, want_state = naive.naive_recurrent_gated_delta_rule(q, k, v, beta, g, **common)
    else:
        want, want_state = naive.naive_chunk_gated_delta_rule(
            q, k, v, g, beta, chunk_size=16, **common
        )
    _assert_close_scaled(list(_reference(x)), [want.transpose(1, 2), want_state], 1e-4)


def _fla_stand_ins(monkeypatch: pytest.MonkeyPatch) -> None:
    """fla's four kernels, with their argument names and (b, n, h, d) layout, computed by its naive
    gated references (no decay: g = 0): the adapters' plumbing checked without CUDA."""
    naive = _fla_naive("gated_delta_rule")

    def normalised(q, k, options):
        if options.pop("use_qk_l2norm_in_kernel"):
            return F.normalize(q, dim=-1, eps=1e-6), F.normalize(k, dim=-1, eps=1e-6)
        return q, k

    def chunk(q, k, v, g, beta, scale, initial_state, output_final_state, **options):
        q, k = normalised(q, k, options)
        assert options == {"chunk_size": 16}
        return naive.naive_chunk_gated_delta_rule(
            q, k, v, g, beta, chunk_size=16, scale=scale, initial_state=initial_state,
            output_final_state=output_final_state,
        )  # fmt: skip

    def recurrent(q, k, v, g, beta, scale, initial_state, output_final_state, **options):
        q, k = normalised(q, k, options)
        assert not options
        return naive.naive_recurrent_gated_delta_rule(
            q, k, v, beta, g, scale=scale, initial_state=initial_state,
            output_final_state=output_final_state,
        )  # fmt: skip

    def without_decay(fn):
        return lambda q, k, v, beta, **kw: fn(q, k, v, torch.zeros_like(beta), beta, **kw)

    for name, attrs in {
        "fla.ops.delta_rule": {
            "chunk_delta_rule": without_decay(chunk),
            "fused_recurrent_delta_rule": without_decay(recurrent),
        },
        "fla.ops.gated_delta_rule": {
            "chunk_gated_delta_rule": chunk,
            "fused_recurrent_gated_delta_rule": recurrent,
        },
    }.items():
        monkeypatch.setitem(sys.modules, name, SimpleNamespace(**attrs))


@pytest.mark.parametrize("normalise_qk", [False, True], ids=["as-given", "normalised"])
@pytest.mark.parametrize("decay", [False, True], ids=["delta", "gated"])
def test_fla_adapters_convert_layouts_and_arguments(monkeypatch, decay, normalise_qk):
    _fla_stand_ins(monkeypatch)
    x = _fla_inputs(37, decay=decay)
    args = (x["q"], 2 * x["k"], x["v"], x["beta"], x["log_decay"])
    options = {"scale": 0.3, "initial_state": x["initial_state"], "normalise_qk": normalise_qk}
    want = chunk_delta(*args, **options)
    for adapter in (fla_chunk_delta, fla_recurrent_delta):
        got = adapter(*args, chunk_length=16, **options)
        _assert_close_scaled(list(got), list(want), 1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("decay", [False, True], ids=["delta", "gated"])
@pytest.mark.parametrize("kind", ["chunk", "recurrent"])
def test_fla_kernels_match_the_chunks_on_cuda(decay, kind):
    """fla's Triton kernels (bfloat16 for the chunked ones) against chunk_delta in float32 on the
    same rounded inputs: outputs, final states and, where fla has a backward, gradients."""
    pytest.importorskip("fla")
    x = _inputs(200, decay=decay, beta_max=1.0, dtype=torch.float32)
    dtype = torch.bfloat16 if kind == "chunk" else torch.float32
    x = _leaves(x, dtype, "cuda")
    x["initial_state"] = x["initial_state"].detach().float().requires_grad_()
    fla = fla_chunk_delta if kind == "chunk" else fla_recurrent_delta
    with_backward = kind == "chunk" or not decay

    def run(fn, inputs):
        args = (inputs["q"], inputs["k"], inputs["v"], inputs["beta"], inputs["log_decay"])
        call = lambda: fn(*args, scale=DK**-0.5, initial_state=inputs["initial_state"])  # noqa: E731
        if not with_backward:
            with torch.no_grad():
                return list(call())
        return _with_grads(call, inputs)

    got, want = run(fla, x), run(chunk_delta, _leaves(x, torch.float32, "cuda"))
    if dtype != torch.bfloat16:
        _assert_close_scaled(got, want, 1e-4)
        return
    # bfloat16: the betas' and decays' gradients sum over a whole key row, looser (as fla's own)
    names = ["out", "state", *(name for name, t in x.items() if t is not None)]
    loose = ("beta", "log_decay")
    _assert_close_scaled(got, want, [5e-2 if n in loose else 2e-2 for n in names[: len(got)]])
