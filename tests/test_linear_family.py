"""linear and performer: the closed form, FAVOR+'s error to softmax, redraw and seed semantics,
padding, and memory linear in the sequence length."""

from __future__ import annotations

import re

import pytest
import torch
from torch.nn import functional as F

from attention_zoo import build_attention, get_backend
from attention_zoo.attention.kernels.sums import scan as linear_scan
from attention_zoo.attention.performer import counter_normal, orthogonal_features
from attention_zoo.errors import OptionError
from attention_zoo.measure.memory import profiled_peak


def _qkv(n: int, *, b: int = 2, h: int = 2, d: int = 16, scale: float = 1.0, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, n, d, generator=g, dtype=torch.float64) * scale for _ in "qkv")


def _padding(n: int) -> torch.Tensor:
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[0, n - 7 :] = False
    mask[1, 4:9] = False
    return mask


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("padded", [False, True], ids=["no-pad", "key-padding"])
def test_linear_equals_its_closed_form(causal, padded):
    n = 45  # not a multiple of the chunk: the last chunk is padded
    q, k, v = _qkv(n)
    mask = _padding(n) if padded else None
    out = build_attention("linear", causal=causal, chunk_length=8)(q, k, v, key_padding_mask=mask)
    scores = (F.elu(q) + 1) @ (F.elu(k) + 1).transpose(-1, -2)  # the O(n^2) formula
    if causal:
        scores = scores.tril()
    if padded:
        scores = scores * mask[:, None, None, :]
    want = scores @ v / (scores.sum(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(out, want, atol=1e-10, rtol=0)


def _softmax_error(causal: bool, nb_features: int, q, k, v) -> float:
    attn = build_attention("performer", causal=causal, nb_features=nb_features, seed=3)
    want = build_attention("full", causal=causal)(q, k, v)
    return float((attn(q, k, v) - want).norm() / want.norm())


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_performer_error_to_softmax_falls_with_features(causal):
    q, k, v = _qkv(64, scale=0.5)
    q, k = q * 0.6, k * 0.6  # small-norm queries and keys: where FAVOR+ is accurate
    errors = [_softmax_error(causal, m, q, k, v) for m in (16, 256, 4096)]
    assert errors[0] > errors[1] > errors[2], errors
    assert errors[2] <= 0.05, errors


def test_performer_redraw_semantics():
    q, k, v = _qkv(20)
    fixed = build_attention("performer", nb_features=32, seed=1)
    assert torch.equal(fixed(q, k, v), fixed(q, k, v))  # training mode, features kept
    again = build_attention("performer", nb_features=32, seed=1)
    assert torch.equal(again(q, k, v), fixed(q, k, v))  # the seed fixes them
    redraw = build_attention("performer", nb_features=32, seed=1, redraw=True)
    first, second = redraw(q, k, v), redraw(q, k, v)
    assert not torch.allclose(first, second)  # new features every training forward
    redraw.eval()
    assert torch.equal(redraw(q, k, v), redraw(q, k, v))  # evaluation keeps the last draw
    spec = get_backend("performer")
    assert spec.caps_for(redraw=False).deterministic
    assert not spec.caps_for(redraw=True).deterministic


def test_seeded_features_are_gaussian_and_orthogonal():
    z = counter_normal(5, 20_000)  # bounds below: ~4 standard errors at this count
    assert torch.equal(z, counter_normal(5, 20_000))
    assert abs(float(z.mean())) < 0.03 and abs(float(z.std()) - 1) < 0.03
    assert abs(float((z**4).mean()) - 3) < 0.3  # a Gaussian's kurtosis, not a uniform's 1.8
    other = counter_normal(6, 20_000)
    assert abs(float(torch.corrcoef(torch.stack([z, other]))[0, 1])) < 0.03
    assert abs(float(torch.corrcoef(torch.stack([z[1:], z[:-1]]))[0, 1])) < 0.03
    w = orthogonal_features(24, 8, seed=5).double()
    gram = w[:8] @ w[:8].T  # one block: orthogonal rows
    torch.testing.assert_close(gram, torch.diag(gram.diagonal()), atol=1e-5, rtol=0)


@pytest.mark.slow  # compiling forward and backward: ~5 s
def test_seeded_performer_compiles_with_eager_results():
    """The default (seeded) draw happens inside the compiled graph on the first call."""
    q, k, v = (t.float().requires_grad_() for t in _qkv(37, d=8))
    eager = build_attention("performer", causal=True, seed=2, nb_features=16)
    traced = build_attention("performer", causal=True, seed=2, nb_features=16)
    torch._dynamo.reset()
    compiled = torch.compile(traced, backend="aot_eager", fullgraph=True)
    out, want = compiled(q, k, v), eager(q, k, v)
    torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(traced.features, eager.features, atol=0, rtol=0)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    for got, ref in zip(grads, torch.autograd.grad(want.sum(), (q, k, v)), strict=True):
        torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-5)


def test_performer_features_travel_in_the_state_dict():
    q, k, v = _qkv(20)
    trained = build_attention("performer", nb_features=32)  # unseeded: global RNG
    out = trained(q, k, v)
    fresh = build_attention("performer", nb_features=32)
    fresh.load_state_dict(trained.state_dict())
    assert torch.equal(fresh(q, k, v), out)


@pytest.mark.parametrize("name", ["linear", "performer"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_padded_keys_add_nothing(name, causal):
    """Appending padded garbage changes no real output (the sums skip zero features)."""
    q, k, v = _qkv(30)
    extra = _qkv(9, seed=1)
    q2, k2, v2 = (torch.cat([a, b * 5], dim=2) for a, b in zip((q, k, v), extra))
    mask = torch.ones(2, 39, dtype=torch.bool)
    mask[:, 30:] = False
    options = {"seed": 0, "nb_features": 32} if name == "performer" else {}
    attn = build_attention(name, causal=causal, chunk_length=8, **options)
    out = attn(q2, k2, v2, key_padding_mask=mask)[:, :, :30]
    torch.testing.assert_close(out, attn(q, k, v), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"feature_map": "softmax"}, "feature_map 'softmax' is not one of: elu+1, relu"),
        ({"eps": 0}, "eps must be a float > 0"),
        ({"chunk_length": 0}, "chunk_length must be an int >= 1"),
    ],
)
def test_linear_bad_options(options, message):
    with pytest.raises(OptionError, match=re.escape(message)):
        build_attention("linear", **options)


def test_performer_bad_options():
    with pytest.raises(OptionError, match="nb_features must be an int >= 1"):
        build_attention("performer", nb_features=0)
    with pytest.raises(OptionError, match="redraw must be True or False"):
        build_attention("performer", redraw="yes")


def peak_bytes(name: str, n: int, *, causal: bool, **options) -> int:
    """Tracked peak of one forward+backward at length n (1 batch, 2 heads of 32)."""
    attn = build_attention(name, causal=causal, **options)
    q, k, v = (torch.randn(1, 2, n, 32, requires_grad=True) for _ in "qkv")

    def step():
        attn(q, k, v).sum().backward()

    step()  # features drawn, nothing lazy left
    return profiled_peak(step)[1].peak_bytes


@pytest.mark.slow  # profiled forward+backward at two lengths: 1-2.5 s each
@pytest.mark.parametrize(
    "name, causal, options",
    [
        ("linear", True, {}),
        ("linear", False, {}),
        ("performer", True, {"nb_features": 64, "seed": 0}),
        ("nystrom", False, {}),
        ("linformer", False, {"proj_length": 64, "max_length": 4096}),
    ],
)
def test_memory_is_linear_in_length(name, causal, options):
    """Twice the length, at most twice the peak (never quadratic: 4x); nystrom's landmark
    matrices and the kernel scan's per-segment buffers are a constant share, so their ratio
    sits lower."""
    short, long = (peak_bytes(name, n, causal=causal, **options) for n in (1024, 2048))
    assert 1.2 <= long / short <= 2.2, (short, long)


@pytest.mark.slow  # profiled forward+backward at two lengths
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("name", ["linear", "performer"])
def test_only_outputs_and_gradients_grow_with_length(name, causal):
    """Longer inputs add only the output and its denominator (kept for backward) and the three
    input gradients to the peak: features, chunk scores and states exist a segment at a time."""
    short, long = 2048, 4096
    grown = peak_bytes(name, long, causal=causal) - peak_bytes(name, short, causal=causal)
    one = 2 * (long - short) * 32 * 4  # one (1, 2, n, 32) float32 tensor's growth
    assert grown <= one * (4 + 1 / 32), (grown, one)  # the denominator: 1 value, not 32


def _autograd_reference(name: str, attn, q, k, v, mask, *, causal: bool, chunk: int):
    """The plain-autograd formulation: full feature tensors, all chunk states at once."""
    if name == "performer":
        d = q.shape[-1]
        w, qs, ks = attn.features.to(q.dtype), q * d**-0.25, k * d**-0.25
        half_w = w.square().sum(-1) / 2
        logits_k = ks @ w.T - ks.square().sum(-1, keepdim=True) / 2 - half_w
        logits_k = logits_k.masked_fill(~mask[:, None, :, None], float("-inf"))
        logits_q = qs @ w.T + half_w
        phi_q = (logits_q - logits_q.amax(-1, keepdim=True).detach()).exp()
        phi_k, eps = logits_k.exp(), torch.finfo(q.dtype).tiny
    else:
        phi = F.relu if attn.cfg.feature_map == "relu" else (lambda x: F.elu(x) + 1)
        phi_q, phi_k, eps = phi(q), phi(k) * mask[:, None, :, None], attn.cfg.eps
    if not causal:
        num = phi_q @ (phi_k.transpose(-1, -2) @ v)
        den = phi_q @ phi_k.sum(-2, keepdim=True).transpose(-1, -2)
        return num / (den + eps)
    n = phi_q.shape[-2]
    npad = -(-n // chunk) * chunk
    qc, kc, vc = (
        F.pad(t, (0, 0, 0, npad - n)).unflatten(2, (npad // chunk, chunk))
        for t in (phi_q, phi_k, v)
    )
    scores = (qc @ kc.transpose(-1, -2)).tril()
    before = F.pad((kc.transpose(-1, -2) @ vc)[:, :, :-1], (0, 0, 0, 0, 1, 0)).cumsum(2)
    num = scores @ vc + qc @ before
    sums = F.pad(kc.sum(-2)[:, :, :-1], (0, 0, 1, 0)).cumsum(2)
    den = scores.sum(-1, keepdim=True) + qc @ sums.unsqueeze(-1)
    return (num / (den + eps)).flatten(2, 3)[:, :, :n]


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize(
    "name, options",
    [
        ("linear", {}),
        ("linear", {"feature_map": "relu"}),
        ("performer", {"seed": 0, "nb_features": 24}),
    ],
    ids=["elu+1", "relu", "favor+"],
)
def test_analytic_gradients_equal_autograd(monkeypatch, name, options, causal):
    """The scan's own backward (several segments, a partial last chunk, padding, batch 2) equals
    autograd through the plain formulation."""
    monkeypatch.setattr(linear_scan, "SEGMENT_LENGTH", 8)  # 37 positions: 5 segments
    q, k, v = (t.requires_grad_() for t in _qkv(37, d=8))
    mask = _padding(37)
    attn = build_attention(name, causal=causal, chunk_length=4, **options)
    out = attn(q, k, v, key_padding_mask=mask)
    want = _autograd_reference(name, attn, q, k, v, mask, causal=causal, chunk=4)
    torch.testing.assert_close(out, want, atol=1e-10, rtol=0)
    g = torch.randn_like(out)
    got_grads = torch.autograd.grad(out, (q, k, v), g)
    want_grads = torch.autograd.grad(want, (q, k, v), g)
    for got, ref in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(got, ref, atol=1e-10, rtol=0)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("name", ["linear", "performer"])
def test_gradients_equal_finite_differences(monkeypatch, name, causal):
    """gradcheck of the analytic backward across segments, padding included."""
    monkeypatch.setattr(linear_scan, "SEGMENT_LENGTH", 4)
    q, k, v = (t[:, :1, :11, :3].clone().requires_grad_() for t in _qkv(11))
    mask = torch.ones(2, 11, dtype=torch.bool)
    mask[0, 6] = False
    options = {"seed": 0, "nb_features": 8} if name == "performer" else {}
    attn = build_attention(name, causal=causal, chunk_length=4, **options)
    assert torch.autograd.gradcheck(
        lambda *t: attn(*t, key_padding_mask=mask), (q, k, v), eps=1e-6, atol=1e-6, fast_mode=True
    )


@pytest.mark.parametrize("name", ["linear", "performer"])
@pytest.mark.parametrize("causal", [True, False])
def test_16_bit_gradients_keep_their_digits(name, causal):
    """bfloat16 inputs, values with a mean far from 0 (where q's gradient is a small difference
    of two large terms): the scan's gradients stay within bfloat16's rounding of a float64 run
    on the same inputs (an output kept in 16 bits for the backward gave 10-100x more)."""
    torch.manual_seed(0)
    core = build_attention(name, causal=causal, kernel="scan")
    q, k, v = (torch.randn(1, 2, 1024, 32) for _ in range(3))
    inputs = [t.bfloat16().requires_grad_() for t in (q, k, v + 3)]
    core(*inputs).float().sum().backward()
    exact = [t.detach().double().requires_grad_() for t in inputs]
    core.double()(*exact).sum().backward()
    for got, want in zip(inputs, exact):
        assert (got.grad.double() - want.grad).norm() / want.grad.norm() < 5e-3
