"""Sigmoid attention: the tiled kernel against the dense reference (outputs and gradients), the
paper's bias, padding, and memory that never holds the n x n map."""

from __future__ import annotations

import math

import pytest
import torch

from attention_zoo import build_attention
from attention_zoo.attention.kernels import sigmoid as kernels
from attention_zoo.errors import OptionError
from attention_zoo.measure.cases import BenchCase, build_runnable
from attention_zoo.measure.flops import count_flops
from attention_zoo.measure.memory import profiled_peak
from attention_zoo.measure.predict import predict_case

from .contract import gappy_padding, grouped_qkv, with_grads


@pytest.fixture
def small_tiles(monkeypatch):
    """Tiles of 8 keys and 16 queries at the tests' sizes: several chunks, blocks and diagonals."""
    monkeypatch.setattr(kernels, "KEY_BLOCK", 8)
    monkeypatch.setattr(kernels, "TILE_BYTES", 2 * 3 * 16 * 8 * 8)


@pytest.mark.usefixtures("small_tiles")
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("padded", [False, True], ids=["no-pad", "key-padding"])
@pytest.mark.parametrize("kv", [4, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize(
    ("dtype", "tol"), [(torch.float64, 1e-10), (torch.float32, 1e-5)], ids=["f64", "f32"]
)
def test_tiles_equal_the_dense_reference(causal, padded, kv, dtype, tol):
    q, k, v = grouped_qkv(dtype, kv)
    mask = gappy_padding() if padded else None
    tiled, math_ = (
        build_attention("sigmoid", causal=causal, kernel=kernel, kv_heads=kv, device="cpu")
        for kernel in ("tiled", "math")
    )
    assert tiled.kernel_for(q, mask, k).name == "tiled"

    def run(core):
        return lambda q, k, v: core(q, k, v, key_padding_mask=mask)

    (out, grads), (ref, ref_grads) = (
        with_grads(run(tiled), [q, k, v]),
        with_grads(run(math_), [q, k, v]),
    )
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, atol=tol, rtol=tol)


@pytest.mark.parametrize("kernel", ["tiled", "math"])
def test_the_bias_is_minus_log_of_the_keys_a_query_sees(kernel):
    """Bidirectional: -log(n) for every query; causal: query i sees i + 1 keys."""
    q, k, v = grouped_qkv(torch.float64, n=20)
    scores = q @ k.transpose(-1, -2) / 4  # head_dim 16
    bidirectional = torch.sigmoid(scores - math.log(20)) @ v
    i = torch.arange(20, dtype=torch.float64)
    weights = torch.sigmoid(scores - torch.log(i + 1)[:, None]).tril()
    for causal, want in ((False, bidirectional), (True, weights @ v)):
        core = build_attention("sigmoid", causal=causal, kernel=kernel, device="cpu")
        torch.testing.assert_close(core(q, k, v), want, atol=1e-12, rtol=1e-12)
    fixed = build_attention("sigmoid", bias=-1.5, kernel=kernel, device="cpu")
    torch.testing.assert_close(fixed(q, k, v), torch.sigmoid(scores - 1.5) @ v)


@pytest.mark.usefixtures("small_tiles")
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("kernel", ["tiled", "math"])
def test_padding_keys_change_nothing(causal, kernel):
    """Padded keys appended after 30 real ones: the real outputs are those of the 30 alone (the
    bias counts real keys only)."""
    q, k, v = grouped_qkv(torch.float64, n=39)
    mask = torch.ones(2, 39, dtype=torch.bool)
    mask[:, 30:] = False
    core = build_attention("sigmoid", causal=causal, kernel=kernel, device="cpu")
    out = core(q, k, v, key_padding_mask=mask)[:, :, :30]
    want = core(q[:, :, :30], k[:, :, :30], v[:, :, :30])
    torch.testing.assert_close(out, want, atol=1e-12, rtol=1e-12)


@pytest.mark.slow
def test_tiled_memory_grows_linearly_in_the_length():
    """Forward and backward: doubling n at most doubles the peak (a map of n x n would quadruple
    it), which at n = 2048 stays far below one (b, h, n, n) map of the dense reference."""
    b, h, d = 1, 4, 16
    core = build_attention("sigmoid", causal=True, kernel="tiled", device="cpu")

    def peak(n):
        q, k, v = (torch.randn(b, h, n, d, requires_grad=True) for _ in range(3))

        def step():
            core(q, k, v).sum().backward()

        step()
        return profiled_peak(step)[1].peak_bytes

    short, long = peak(1024), peak(2048)
    assert long < 2.2 * short, f"peak {short} bytes at n=1024, {long} at 2048"
    assert long < b * h * 2048**2 * 4 / 4, f"peak {long} bytes, one n x n map {4 * 2048**2 * 4}"


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["forward", "forward+backward"])
def test_predictions_are_the_measured_numbers_over_many_tiles(mode):
    """On meta tensors the kernel runs one tile per query chunk (each allocates what any other
    does) and only counts the others' products: at a length of many tiles the predicted peak is
    still the measured one, and the predicted FLOPs those counted on real tensors."""
    case = BenchCase(target="attention", backend="sigmoid", seq_len=4000, mode=mode, causal=True)
    runnable = build_runnable(case)
    runnable.step()
    measured = profiled_peak(runnable.step)[1].peak_bytes
    predicted = predict_case(case)
    assert abs(measured - predicted.peak_bytes) <= 0.03 * measured, (measured, predicted)
    assert predicted.flops == count_flops(runnable.step)[1]


def test_options_are_checked_in_one_line():
    with pytest.raises(OptionError, match="bias must be a float or None"):
        build_attention("sigmoid", bias="log", device="cpu")
    with pytest.raises(OptionError, match="kernel"):
        build_attention("sigmoid", kernel="flex", device="cpu")
