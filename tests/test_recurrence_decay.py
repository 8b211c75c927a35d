"""The chunked decay-gated recurrences (RetNet, Mamba2's SSD, GLA, plain linear attention) against
the token-by-token reference, forward and every gradient; the reference against fla's naive
references; fla's kernels against the chunked form (CUDA), and their layout on the CPU."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch
from torch import Tensor
from torch.nn import functional as F

from attention_zoo.attention.kernels.recurrences import decay
from attention_zoo.attention.kernels.recurrences.decay import chunk_decay
from attention_zoo.attention.kernels.recurrences.fla import fla_recurrence
from attention_zoo.attention.kernels.recurrences.reference import recurrence
from attention_zoo.measure import tracked_peak

from .test_recurrence_delta import _fla_naive

fla_chunk_decay = partial(fla_recurrence, beta=None, chunked=True)
fla_recurrent_decay = partial(fla_recurrence, beta=None, chunked=False)

KINDS = ("none", "scalar", "channel")
pytestmark = pytest.mark.filterwarnings("ignore:Triton is not supported")


def make_inputs(
    kind: str,
    n: int,
    *,
    dtype: torch.dtype = torch.float64,
    b: int = 2,
    h: int = 3,
    dk: int = 8,
    dv: int = 5,
) -> dict[str, Tensor | None]:
    """q, k, v, a log decay of the kind (<= 0, a log-sigmoid as gates are) and a state."""
    q, k = torch.randn(2, b, h, n, dk, dtype=dtype)
    v = torch.randn(b, h, n, dv, dtype=dtype)
    shape = {"none": None, "scalar": (b, h, n), "channel": (b, h, n, dk)}[kind]
    log_decay = None if shape is None else F.logsigmoid(2 * torch.randn(shape, dtype=dtype))
    state = torch.randn(b, h, dk, dv, dtype=dtype)
    return {"q": q, "k": k, "v": v, "log_decay": log_decay, "initial_state": state}


def apply(fn, inputs: dict[str, Tensor | None]) -> dict[str, Tensor | None]:
    return {name: None if t is None else fn(t) for name, t in inputs.items()}


def outputs_and_grads(fn, inputs: dict[str, Tensor | None], **kw) -> list[Tensor]:
    """o, the final state and the gradients of every input of a random linear loss of both."""
    leaves = {name: t.detach().requires_grad_() for name, t in inputs.items() if t is not None}
    o, state = fn(
        leaves["q"],
        leaves["k"],
        leaves["v"],
        log_decay=leaves.get("log_decay"),
        initial_state=leaves["initial_state"],
        **kw,
    )
    gen = torch.Generator().manual_seed(1)
    wo = torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o)
    ws = torch.randn(state.shape, generator=gen, dtype=torch.float64).to(state)
    grads = torch.autograd.grad((o * wo).sum() + (state * ws).sum(), list(leaves.values()))
    return [o.detach(), state.detach(), *grads]


def assert_close(got: list[Tensor], want: list[Tensor], tol: float) -> None:
    """Each pair within tol relative to the scale (the largest magnitude) of the expected one."""
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape, i
        assert torch.isfinite(a).all(), i
        err = (a.double() - b.double()).abs().max().item()
        assert err <= tol * max(b.abs().max().item(), 1e-30), (i, err)


def reference(q, k, v, log_decay=None, *, scale, initial_state=None):
    return recurrence(q, k, v, log_decay=log_decay, scale=scale, initial_state=initial_state)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("n", "chunk"), [(1, 16), (5, 16), (37, 8), (100, 16)])
def test_matches_the_recurrence_in_float64(
    kind: str, n: int, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # segments of 32 tokens: 37 and 100 tokens run several, the state crossing between them
    monkeypatch.setattr(decay, "SEGMENT_LENGTH", 32)
    inputs = make_inputs(kind, n)
    got = outputs_and_grads(chunk_decay, inputs, scale=0.3, chunk_length=chunk)
    assert_close(got, outputs_and_grads(reference, inputs, scale=0.3), 1e-10)


@pytest.mark.parametrize("kind", KINDS)
def test_matches_the_recurrence_in_float32(kind: str) -> None:
    inputs = make_inputs(kind, 150, dtype=torch.float32)
    want = outputs_and_grads(reference, apply(Tensor.double, inputs), scale=0.3)
    assert_close(outputs_and_grads(chunk_decay, inputs, scale=0.3), want, 1e-5)


@pytest.mark.parametrize("kind", ("scalar", "channel"))
def test_strong_decays_stay_finite_and_exact(kind: str) -> None:
    """Log decays down to -20 a token: cumulative sums over a chunk reach hundreds."""
    inputs = make_inputs(kind, 80, dtype=torch.float32)
    inputs["log_decay"] = -20 * torch.rand_like(inputs["log_decay"])
    want = outputs_and_grads(reference, apply(Tensor.double, inputs), scale=0.3)
    assert_close(outputs_and_grads(chunk_decay, inputs, scale=0.3, chunk_length=64), want, 1e-5)


@pytest.mark.parametrize("kind", ("scalar", "channel"))
def test_a_decay_of_zero_resets_the_state(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Log decays of -inf (a hard reset) inside chunks and on a segment's edge: as the
    recurrence, never -inf - -inf."""
    monkeypatch.setattr(decay, "SEGMENT_LENGTH", 16)
    inputs = make_inputs(kind, 40)
    for t in (5, 16, 29):
        inputs["log_decay"][:, :, t] = -torch.inf
    got = outputs_and_grads(chunk_decay, inputs, scale=0.3, chunk_length=8)
    assert_close(got, outputs_and_grads(reference, inputs, scale=0.3), 1e-10)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("n1", "n2"), [(40, 1), (17, 23)])
def test_a_prefill_then_more_tokens_is_the_whole_sequence(kind: str, n1: int, n2: int) -> None:
    whole = make_inputs(kind, n1 + n2)
    whole["initial_state"] = None
    o, state = chunk_decay(**whole, scale=0.5, chunk_length=16)
    first, second = (apply(lambda t, s=s: t[:, :, s], whole) for s in (slice(n1), slice(n1, None)))
    o1, carried = chunk_decay(**first, scale=0.5, chunk_length=16)
    o2, state2 = chunk_decay(**{**second, "initial_state": carried}, scale=0.5, chunk_length=16)
    assert_close([torch.cat([o1, o2], dim=2), state2], [o, state], 1e-12)


def test_16_bit_inputs_compute_in_float32() -> None:
    inputs = make_inputs("channel", 40, dtype=torch.bfloat16)
    got = outputs_and_grads(chunk_decay, inputs, scale=0.3)
    # o and the gradients in the inputs' dtype, the final state in float32
    assert [t.dtype for t in got] == [torch.bfloat16, torch.float32] + [torch.bfloat16] * 5
    want = outputs_and_grads(chunk_decay, apply(Tensor.float, inputs), scale=0.3)
    assert_close([t.float() for t in got], want, 2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_decay_weights_are_each_span_s_decay_and_never_subnormal(dtype: torch.dtype) -> None:
    """exp(g_{j+1} + ... + g_i) for j <= i, 0 above the diagonal, 0 across a decay of 0 (-inf)
    and below the square root of the smallest normal number, never a subnormal."""
    c = 16
    gen = torch.Generator().manual_seed(5)
    g = F.logsigmoid(torch.randn(3, c, 1, dtype=torch.float64, generator=gen))
    g[1, 6] = -math.inf
    g[2, 4:9] = -30.0  # spans over them fall below the float32 floor, not the float64 one
    want = torch.zeros(3, c, c, dtype=torch.float64)
    for i in range(c):
        for j in range(i + 1):
            want[:, i, j] = g[:, j + 1 : i + 1, 0].sum(-1).exp()
    floor = math.sqrt(torch.finfo(dtype).tiny)
    want[want < floor] = 0
    got = decay.decay_weights(g.to(dtype))
    assert got.dtype == dtype
    rtol = 1e-5 if dtype == torch.float32 else 1e-12  # eps x |exponent|: spans reach -150
    torch.testing.assert_close(got.double(), want, rtol=rtol, atol=0)
    assert (got[got != 0] >= floor).all()
    assert not got[1, 6:, :6].any()  # nothing crosses the reset


def test_chunk_length_is_a_power_of_two() -> None:
    with pytest.raises(ValueError, match="power of two"):
        chunk_decay(**make_inputs("scalar", 8), scale=1.0, chunk_length=48)


@pytest.mark.slow
def test_backward_holds_no_state_per_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forward and backward stay far below one n x dk x dv tensor: chunk states live per segment."""
    monkeypatch.setattr(decay, "SEGMENT_LENGTH", 128)
    inputs = make_inputs("channel", 512, dtype=torch.float32, b=1, h=1, dk=64, dv=64)
    _, peak = tracked_peak(lambda: outputs_and_grads(chunk_decay, inputs, scale=0.2))
    assert peak.peak_bytes < 512 * 64 * 64 * 4 / 4


@pytest.mark.parametrize("wanted", [("v",), ("log_decay", "initial_state"), ("q", "log_decay")])
def test_gradients_of_some_inputs(wanted: tuple[str, ...]) -> None:
    inputs = make_inputs("channel", 40)
    leaves = {name: t.requires_grad_(name in wanted) for name, t in inputs.items()}
    o, state = chunk_decay(**leaves, scale=0.3, chunk_length=16)
    o_ref, state_ref = reference(**leaves, scale=0.3)
    got = torch.autograd.grad(o.sum() + state.sum(), [leaves[n] for n in wanted])
    want = torch.autograd.grad(o_ref.sum() + state_ref.sum(), [leaves[n] for n in wanted])
    assert_close(list(got), list(want), 1e-10)


# fla's naive references ((b, n, h, d) unless said): our reference is the recurrence they define


def _fla_layout(*ts: Tensor) -> list[Tensor]:
    return [t.transpose(1, 2) for t in ts]


def test_reference_is_fla_retention() -> None:
    """naive_retention takes (b, h, n, d), scales by d^-0.5, decays head i by 1 - 2^(-5-i)."""
    naive = _fla_naive("retention")
    inputs = make_inputs("none", 50, dtype=torch.float32, h=4, dk=16, dv=16)
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    gamma = 1 - 2.0 ** (-5.0 - torch.arange(4, dtype=torch.float32))
    log_decay = gamma.log()[:, None].expand(2, 4, 50)
    want = naive.naive_retention(q, k, v)
    o, _ = recurrence(q, k, v, log_decay=log_decay, scale=16**-0.5)
    assert_close([o], [want], 1e-4)


def test_reference_is_fla_simple_gla() -> None:
    naive = _fla_naive("simple_gla")
    inputs = make_inputs("scalar", 70, dtype=torch.float32)
    q, k, v, g, s0 = inputs.values()
    want = naive.naive_recurrent_simple_gla(
        *_fla_layout(q, k, v, g), scale=0.3, initial_state=s0, output_final_state=True
    )
    chunked = naive.naive_chunk_simple_gla(
        *_fla_layout(q, k, v, g), s0.clone(), True, chunk_size=16, scale=0.3
    )
    o, state = recurrence(q, k, v, log_decay=g, scale=0.3, initial_state=s0)
    for fla_o, fla_state in (want, chunked):
        assert_close([o, state], [fla_o.transpose(1, 2), fla_state], 1e-4)


def test_reference_is_fla_gla() -> None:
    """naive_recurrent_gla scales by dk^-0.5 and takes no scale."""
    naive = _fla_naive("gla")
    q, k, v, g, s0 = make_inputs("channel", 60, dtype=torch.float32).values()
    fla_o, fla_state = naive.naive_recurrent_gla(
        *_fla_layout(q, k, v, g), initial_state=s0, output_final_state=True
    )
    o, state = recurrence(q, k, v, log_decay=g, scale=8**-0.5, initial_state=s0)
    assert_close([o, state], [fla_o.transpose(1, 2), fla_state], 1e-4)


# fla's kernels: their arguments and layout on the CPU (fla's naive functions stand in), and
# their results on CUDA


def _naive_fla_ops(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Replace fla's four kernels by its naive recurrences (same layout); record their calls."""
    pytest.importorskip("triton", reason="fla's kernel modules import Triton")
    pytest.importorskip("fla.ops.gla.naive")
    import fla.ops.gla as gla
    import fla.ops.gla.naive as gla_naive
    import fla.ops.simple_gla as simple_gla
    import fla.ops.simple_gla.naive as simple_naive

    calls = []

    def simple(name):
        def op(q, k, v, g=None, *, scale, initial_state, output_final_state):
            calls.append({"op": name, "g": g, "initial_state": initial_state})
            g = q.new_zeros(q.shape[:3], dtype=torch.float32) if g is None else g
            return simple_naive.naive_recurrent_simple_gla(
                q, k, v, g, scale=scale, initial_state=initial_state,
                output_final_state=output_final_state,
            )  # fmt: skip

        return op

    def channel(name, key):
        def op(q, k, v, *, scale, initial_state, output_final_state, **g):
            calls.append({"op": name, "g": g[key], "initial_state": initial_state})
            return gla_naive.naive_recurrent_gla(
                q * scale * q.shape[-1] ** 0.5, k, v, g[key], initial_state, output_final_state
            )

        return op

    monkeypatch.setattr(simple_gla, "chunk_simple_gla", simple("scalar chunk"))
    monkeypatch.setattr(simple_gla, "fused_recurrent_simple_gla", simple("scalar fused"))
    monkeypatch.setattr(gla, "chunk_gla", channel("channel chunk", "g"))
    monkeypatch.setattr(gla, "fused_recurrent_gla", channel("channel fused", "gk"))
    return calls


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fn", [fla_chunk_decay, fla_recurrent_decay])
def test_fla_adapters_convert_the_layout(kind: str, fn, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _naive_fla_ops(monkeypatch)
    inputs = make_inputs(kind, 30, dtype=torch.float32)
    inputs["initial_state"] = inputs["initial_state"].half()
    got = fn(**inputs, scale=0.3)
    want = chunk_decay(**{**inputs, "initial_state": inputs["initial_state"].float()}, scale=0.3)
    assert_close(list(got), list(want), 1e-5)
    expected = "channel" if kind == "channel" else "scalar"
    expected += " chunk" if fn is fla_chunk_decay else " fused"
    (call,) = calls
    assert call["op"] == expected and call["initial_state"].dtype == torch.float32
    assert call["g"] is None if kind == "none" else call["g"].dtype == torch.float32


@pytest.mark.gpu
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("fn", "n"), [(fla_chunk_decay, 300), (fla_recurrent_decay, 3)])
def test_fla_kernels_match_the_chunked_form_on_cuda(kind: str, fn, n: int) -> None:
    pytest.importorskip("fla")
    inputs = make_inputs(kind, n, dtype=torch.float32, b=2, h=4, dk=64, dv=64)
    inputs = apply(Tensor.cuda, inputs)
    scale = 1 / math.sqrt(64)
    want = outputs_and_grads(chunk_decay, inputs, scale=scale)
    # fla's Triton products of float32 inputs may run in TF32
    assert_close(outputs_and_grads(fn, inputs, scale=scale), want, 1e-2)
