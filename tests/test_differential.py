"""Differential attention: its fused CPU and SDPA kernels against the dense reference (outputs and
gradients, lambda's included), the fused kernel's backward by gradcheck and its peak memory, the
paper's formula and lambda schedule, padding, and its one-line refusals."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attention_zoo import build_attention
from attention_zoo.attention.differential import lambda_init
from attention_zoo.attention.kernels import differential as kernels
from attention_zoo.attention.kernels.differential import fused_differential
from attention_zoo.errors import OptionError, ShapeError
from attention_zoo.measure.memory import profiled_peak

from .contract import gappy_padding, grouped_qkv, with_grads

KERNELS = ["cpu-fused", "sdpa", "math"]


@pytest.fixture
def small_tiles(monkeypatch):
    """The backward's tiles an eighth of the tests' lengths (2 rows at the least): several on
    and below the diagonal, and a short last one."""
    monkeypatch.setattr(kernels, "TILE_MIN", 2)


def _pair(kernel, causal, kv, dtype, **options):
    """The kernel and the math one with the same learned lambda vectors."""
    cores = [
        build_attention(
            "differential", causal=causal, kernel=name, kv_heads=kv, device="cpu", **options
        ).to(dtype)
        for name in (kernel, "math")
    ]
    cores[1].load_state_dict(cores[0].state_dict())
    return cores


def _paper(q, k, v, core, allowed=None):
    """The paper's formula written out: softmax maps of the half heads, their difference with
    lambda, an RMSNorm per head, times 1 - lambda_init."""
    half = q.shape[-1] // 2
    k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], 1) for t in (k, v))

    def softmax_map(qh, kh):
        scores = qh @ kh.transpose(-1, -2) / math.sqrt(half)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, -math.inf)
        return torch.softmax(scores, -1) @ v

    lam = core.lam().detach()
    first = softmax_map(q[..., :half], k[..., :half])
    diff = first - lam * softmax_map(q[..., half:], k[..., half:])
    return F.rms_norm(diff, (q.shape[-1],), eps=1e-5) * (1 - core.lambda_init)


@pytest.mark.usefixtures("small_tiles")
@pytest.mark.parametrize("kernel", ["cpu-fused", "sdpa"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("padded", [False, True], ids=["no-pad", "key-padding"])
@pytest.mark.parametrize("kv", [4, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize(
    ("dtype", "tol"), [(torch.float64, 1e-10), (torch.float32, 1e-5)], ids=["f64", "f32"]
)
def test_kernel_equals_the_dense_reference(kernel, causal, padded, kv, dtype, tol):
    """Outputs and the gradients of q, k, v and of lambda's vectors, on every query that sees a
    real key."""
    q, k, v = grouped_qkv(dtype, kv)
    mask = gappy_padding() if padded else None
    fused, dense = _pair(kernel, causal, kv, dtype)
    assert fused.kernel_for(q, mask, k).name == kernel
    rows = slice(3, None)  # causal: the first queries of row 1 see only padding
    runs = []
    for core in (fused, dense):
        core.zero_grad()
        out, grads = with_grads(lambda q, k, v, c=core: c(q, k, v, mask)[:, :, rows], [q, k, v])
        runs.append((out, grads, [p.grad for p in core.parameters()]))
    (out, grads, params), (ref, ref_grads, ref_params) = runs
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
    for got, want in zip([*grads, *params], [*ref_grads, *ref_params]):
        torch.testing.assert_close(got, want, atol=tol, rtol=tol)


@pytest.mark.slow
@pytest.mark.usefixtures("small_tiles")
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("padded", [False, True], ids=["no-pad", "key-padding"])
@pytest.mark.parametrize("kv", [2, 1], ids=["mha", "mqa"])
def test_fused_backward_passes_gradcheck(causal, padded, kv):
    """The tiled backward (the first map's output recovered, the second's gradient scaled by
    -lambda) against finite differences, lambda included, in float64."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 6, 4, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (
        torch.randn(1, kv, 6, 4, generator=g, dtype=torch.float64, requires_grad=True)
        for _ in range(2)
    )
    lam = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, True, False, True, True, False]]) if padded else None

    def fn(q, k, v, lam):
        return fused_differential(q, k, v, lam, mask, causal=causal, out_scale=0.8)

    assert torch.autograd.gradcheck(fn, (q, k, v, lam))


@pytest.mark.slow  # two profiled forward+backward passes at 2048 tokens: ~2 s
def test_fused_kernel_peak_memory_is_within_one_and_a_half_sdpa():
    """Forward+backward at (1, 4, 2048, 64), causal: the fused kernel keeps two maps' outputs
    and log-sum-exps and takes half-width gradients, no key-sized copies, so its profiled peak
    stays within 1.5 times one SDPA call's."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 2048, 64, generator=g, requires_grad=True) for _ in range(3))
    grad = torch.randn(1, 4, 2048, 64, generator=g)
    cores = [build_attention(name, causal=True, device="cpu") for name in ("sdpa", "differential")]
    assert cores[1].kernel_for(q, None, k).name == "cpu-fused"

    def peak(core):
        def step():
            core(q, k, v).backward(grad)
            q.grad = k.grad = v.grad = None

        step()
        return profiled_peak(step)[1].peak_bytes

    reference, fused = (peak(core) for core in cores)
    assert fused <= 1.5 * reference, (fused, reference)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_it_computes_the_papers_formula(kernel, causal):
    q, k, v = grouped_qkv(kv=2)
    core = build_attention(
        "differential", causal=causal, kernel=kernel, kv_heads=2, layer=4, device="cpu"
    ).double()
    allowed = torch.ones(45, 45, dtype=torch.bool).tril() if causal else None
    with torch.no_grad():
        torch.testing.assert_close(core(q, k, v), _paper(q, k, v, core, allowed))


@pytest.mark.parametrize("kernel", KERNELS)
def test_at_lambda_zero_it_is_the_first_map_normalised(kernel):
    """lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init = 0: the second map drops out."""
    q, k, v = grouped_qkv()
    core = build_attention("differential", causal=True, kernel=kernel, device="cpu").double()
    with torch.no_grad():
        for p in core.parameters():
            p.zero_()
        core.lambda_q1[0], core.lambda_k1[0] = math.log(1 - core.lambda_init), 1.0
        assert abs(core.lam().item()) < 1e-12
        half = 8
        scores = q[..., :half] @ k[..., :half].transpose(-1, -2) / math.sqrt(half)
        future = torch.ones(45, 45, dtype=torch.bool).triu(1)
        first = torch.softmax(scores.masked_fill(future, -math.inf), -1) @ v
        want = F.rms_norm(first, (16,), eps=1e-5) * (1 - core.lambda_init)
        torch.testing.assert_close(core(q, k, v), want, atol=1e-12, rtol=1e-12)


def test_lambda_follows_the_depth_schedule():
    """lambda_init = 0.8 - 0.6 exp(-0.3 (layer - 1)); with zero vectors lambda is lambda_init."""
    assert lambda_init(1) == pytest.approx(0.2)
    assert lambda_init(3) == pytest.approx(0.8 - 0.6 * math.exp(-0.6))
    assert lambda_init(100) == pytest.approx(0.8, abs=1e-9)
    core = build_attention("differential", layer=3, device="cpu")
    with torch.no_grad():
        for p in core.parameters():
            p.zero_()
    assert core.lam().item() == pytest.approx(lambda_init(3))


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_padding_keys_change_nothing(causal, kernel):
    q, k, v = grouped_qkv(n=39)
    mask = torch.ones(2, 39, dtype=torch.bool)
    mask[:, 30:] = False
    core = build_attention("differential", causal=causal, kernel=kernel, device="cpu").double()
    with torch.no_grad():
        out = core(q, k, v, key_padding_mask=mask)[:, :, :30]
        want = core(q[:, :, :30], k[:, :, :30], v[:, :, :30])
    torch.testing.assert_close(out, want, atol=1e-12, rtol=1e-12)


def test_refusals_say_what_works_in_one_line():
    core = build_attention("differential", device="cpu")
    q = torch.randn(1, 2, 8, 15)
    with pytest.raises(ShapeError, match="head_dim must be even, got 15") as info:
        core(q, q, q)
    assert "\n" not in str(info.value)
    with pytest.raises(OptionError, match="layer"):
        build_attention("differential", layer=0, device="cpu")
