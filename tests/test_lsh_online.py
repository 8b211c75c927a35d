"""The fused LSH kernel's online round merge: slices of rounds give the materialised kernel's
outputs and gradients, and its memory grows with the sequence only as the mechanism's own does."""

from __future__ import annotations

import pytest
import torch

from attention_zoo import build_attention
from attention_zoo.attention.kernels.rounds import lsh_fused
from attention_zoo.measure.memory import profiled_peak

from .contract import with_grads


def _budgets(monkeypatch, slots: int, row_bytes: int, rows: int) -> None:
    """Pass budgets of `slots` slots per (b, h) row: every round cut into several slices."""
    for name in ("FORWARD_PASS_BYTES", "BACKWARD_PASS_BYTES"):
        monkeypatch.setattr(lsh_fused, name, slots * row_bytes * rows)


@pytest.mark.parametrize("semantics", ["exact", "hf"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_rounds_in_slices_equal_the_materialised_kernel(monkeypatch, semantics, causal):
    """Three rounds, each cut into uneven slices (forward and backward): outputs and gradients of
    shared and separate keys equal the materialised kernel's in float64."""
    b, h, n, d = 2, 2, 100, 8
    _budgets(monkeypatch, slots=40, row_bytes=d * 8, rows=b * h)  # npad 128: 4 slices a round
    g = torch.Generator().manual_seed(0)
    qk, k, v = (torch.randn(b, h, n, d, generator=g, dtype=torch.float64) for _ in range(3))
    opts = dict(chunk_length=32, num_hashes=3, num_buckets=4, seed=1, semantics=semantics)
    cores = {
        kernel: build_attention("lsh", causal=causal, kernel=kernel, **opts)
        for kernel in ("math", "cpu-fused")
    }
    for inputs, fn in (
        ((qk, v), lambda core: lambda x, y: core(x, x, y)),
        ((qk, k, v), lambda core: core),
    ):
        want_out, want_grads = with_grads(fn(cores["math"]), inputs)
        out, grads = with_grads(fn(cores["cpu-fused"]), inputs)
        torch.testing.assert_close(out, want_out, atol=1e-9, rtol=1e-9)
        for got, want in zip(grads, want_grads):
            torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-9)


def _lsh_peak(n: int, **options) -> int:
    """Peak bytes above the inputs of one causal forward+backward at n tokens (1 x 4 x 64)."""
    g = torch.Generator().manual_seed(0)
    qk, v = (torch.randn(1, 4, n, 64, generator=g).requires_grad_() for _ in range(2))
    core = build_attention("lsh", causal=True, seed=0, **options)

    def step() -> None:
        out = core(qk, qk, v)
        out.backward(torch.ones_like(out))

    return profiled_peak(step)[1].peak_bytes


@pytest.mark.slow
def test_memory_grows_as_the_mechanism_needs_not_per_round(monkeypatch):
    """Doubling the sequence adds what the mechanism keeps per token (output, its gradient and
    the inputs' gradients: 5 rows of d floats at most, with shared QK) plus the small per-round
    integers, whatever the number of rounds: sorted copies of q, k, v for every round would add
    3 rows per round and token (the kernel before the online merge: 18x the bound at 4 rounds).
    Small pass budgets put both lengths in the sliced regime."""
    _budgets(monkeypatch, slots=128, row_bytes=64 * 4, rows=4)
    n1, n2 = 512, 1024
    row = 4 * 64 * 4  # one token's (heads x d) float32 row
    for hashes in (1, 4):
        growth = _lsh_peak(n2, num_hashes=hashes) - _lsh_peak(n1, num_hashes=hashes)
        per_token = growth / (n2 - n1)
        assert per_token <= 5.5 * row + 64 * hashes, (hashes, per_token / row)


@pytest.mark.slow
def test_at_the_default_budgets_scratch_is_a_few_passes_not_the_rounds():
    """8,192 tokens, 4 hashes, the kernel's own pass budgets: the peak is the mechanism's 5 rows
    per token plus at most 4 forward pass budgets (the kernel before the online merge kept
    sorted copies of every round: 3.2x this bound)."""
    n = 8192
    row = 4 * 64 * 4
    bound = 5 * row * n + 4 * lsh_fused.FORWARD_PASS_BYTES
    peak = _lsh_peak(n, num_hashes=4)
    assert peak <= bound, (peak / 2**20, bound / 2**20)
