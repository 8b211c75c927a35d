"""sliding-window and bigbird: their patterns, options, seeds and memory (the conformance suite
checks them against a dense masked softmax); bidirectional-only backends refuse causal runs."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from attention_zoo import ReformerConfig, build_attention
from attention_zoo.attention import BACKENDS, AttentionCore, Capabilities, register_attention
from attention_zoo.attention.kernels.dense import dense_attention
from attention_zoo.attention.spec import get_backend
from attention_zoo.errors import ConfigError, OptionError
from attention_zoo.measure.tracker import tracked_peak

from .contract import with_grads

SMALL_BIGBIRD = dict(block_size=4, num_window_blocks=3, num_global_blocks=1, num_random_blocks=2)


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        (
            "sliding-window",
            {"window": 0},
            "sliding-window option window must be an int >= 1, got 0",
        ),
        ("sliding-window", {"window": True}, "option window must be an int >= 1, got True"),
        ("sliding-window", {"global_tokens": -1}, "option global_tokens must be an int >= 0"),
        ("sliding-window", {"dropout": 1.0}, "option dropout must be a float in [0, 1)"),
        ("bigbird", {"block_size": 0}, "bigbird option block_size must be an int >= 1, got 0"),
        ("bigbird", {"num_window_blocks": 0}, "option num_window_blocks must be an int >= 1"),
        ("bigbird", {"num_random_blocks": 1.5}, "option num_random_blocks must be an int >= 0"),
        ("bigbird", {"seed": -1}, "bigbird option seed must be an int >= 0 or None, got -1"),
        ("bigbird", {"seed": 1.0}, "bigbird option seed must be an int >= 0 or None, got 1.0"),
    ],
)
def test_bad_options_are_one_line_errors(name, options, message):
    with pytest.raises(OptionError) as err:
        build_attention(name, device="cpu", **options)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_sliding_window_pattern_is_the_band_and_the_global_tokens():
    i = torch.arange(20)
    diff = i[:, None] - i[None, :]
    causal = build_attention("sliding-window", causal=True, device="cpu", window=4)
    assert causal.pattern(20).equal((diff >= 0) & (diff < 4))
    both = build_attention("sliding-window", device="cpu", window=4, global_tokens=2)
    band = diff.abs() < 4
    glob = (i[:, None] < 2) | (i[None, :] < 2)
    assert both.pattern(20).equal(band | glob)


def test_bigbird_blocks_are_window_global_and_distinct_random_ones():
    for causal in (False, True):
        attn = build_attention("bigbird", causal=causal, device="cpu", **SMALL_BIGBIRD, seed=3)
        nb = 12
        table = attn.random_blocks(nb, "cpu")  # (nb, 2)
        for i in range(1, nb):  # block 0 is global
            lo = int(attn.window_start(torch.tensor(i)))
            window = set(range(max(lo, 0), min(lo + 3, nb)))
            picks = [int(b) for b in table[i] if b >= 0]
            assert len(set(picks)) == len(picks)
            assert all(b >= 1 and b not in window and b < nb for b in picks)
            if causal:
                assert all(b < lo for b in picks)
            candidates = nb - 1 - len(window - {0}) if not causal else max(lo - 1, 0)
            assert len(picks) == min(2, candidates)  # as many as exist, up to num_random_blocks
            seen = attn.pattern(nb * 4)[i * 4].view(nb, 4).all(-1) if not causal else None
            if seen is not None:
                assert set(seen.nonzero().flatten().tolist()) == {0} | window | set(picks)


def test_bigbird_random_blocks_are_fixed_by_the_seed():
    def pattern(seed, **extra):
        attn = build_attention("bigbird", device="cpu", **SMALL_BIGBIRD, seed=seed, **extra)
        return attn.pattern(64)

    assert pattern(1).equal(pattern(1))
    assert not pattern(1).equal(pattern(2))
    q, k, v = (torch.randn(1, 2, 64, 8) for _ in range(3))
    one, two = (build_attention("bigbird", device="cpu", **SMALL_BIGBIRD, seed=1) for _ in "ab")
    assert one(q, k, v).equal(two(q, k, v))
    caps = get_backend("bigbird").caps_for(seed=None)
    assert not caps.deterministic and not caps.fixed_pattern and caps.kind == "approximate"
    assert get_backend("bigbird").caps.kind == "pattern"


def test_capabilities_say_which_kind_of_attention_each_backend_is():
    kinds = {s.name: s.caps.kind for s in BACKENDS}
    assert kinds["full"] == kinds["sdpa"] == "full"
    assert kinds["sliding-window"] == kinds["bigbird"] == kinds["local"] == "pattern"
    assert kinds["lsh"] == "approximate"
    assert get_backend("local").caps_for(semantics="hf").kind == "approximate"
    assert get_backend("bigbird").describe()["capabilities"]["kind"] == "pattern"


def _fwd_bwd_peak(name: str, n: int, **options) -> int:
    attn = build_attention(name, causal=True, device="cpu", **options)
    q, k, v = (torch.randn(1, 2, n, 16, requires_grad=True) for _ in range(3))
    _, peak = tracked_peak(lambda: attn(q, k, v).sum().backward())
    return peak.peak_bytes


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("sliding-window", {"window": 64}),
        ("sliding-window", {"window": 64, "global_tokens": 16}),
        ("bigbird", {"block_size": 32}),
    ],
    ids=["band", "band+global", "bigbird"],
)
def test_forward_and_backward_memory_grows_at_most_linearly(name, options):
    """2x the length, at most ~2x the tracked peak (n x n scores would make it 4x); less where
    the kernels' bounded scratch is a large part of it."""
    small, large = (_fwd_bwd_peak(name, n, **options) for n in (512, 1024))
    assert large / small < 2.05, f"{name}: peak {small} -> {large} bytes for 2x the length"


def test_bidirectional_only_backends_refuse_causal_in_one_line_naming_what_works():
    @dataclass(frozen=True, kw_only=True)
    class _Options:
        """No options."""

    @register_attention("test-bidirectional", config=_Options, caps=Capabilities(causal=False))
    class _Bidirectional(AttentionCore):
        """Bidirectional only (toy)."""

    try:
        with pytest.raises(OptionError) as err:
            build_attention("test-bidirectional", causal=True, device="cpu")
        message = str(err.value)
        assert "\n" not in message and "cannot run causally" in message
        assert "causal=False" in message and "sliding-window, bigbird" in message
        assert "test-bidirectional, " not in message  # it names only those that can
        with pytest.raises(ConfigError) as err:
            ReformerConfig(attn_layers=["test-bidirectional"], is_decoder=True)
        message = str(err.value)
        assert "set is_decoder=False" in message and "causal=False" not in message
        assert "causal backend: full, sdpa" in message and "\n" not in message
    finally:
        BACKENDS.remove("test-bidirectional")


@pytest.mark.parametrize("name", ["sliding-window", "bigbird"])
def test_the_sdpa_path_off_cpu_kernels_equals_the_pattern(name):
    """The path taken on CUDA and with dropout (every block at once through SDPA), batch 2 with
    padding, in float64: the pattern's dense masked softmax, and dropout only in training."""
    from attention_zoo.attention.kernels.dense import dense_attention

    options = {"window": 8, "global_tokens": 3} if name == "sliding-window" else SMALL_BIGBIRD
    options["kernel"] = "math"
    mask = torch.ones(2, 45, dtype=torch.bool)
    mask[0, 30:] = False
    q, k, v = (torch.randn(2, 3, 45, 16, dtype=torch.float64) for _ in range(3))
    for causal in (False, True):
        attn = build_attention(name, causal=causal, device="cpu", dropout=0.5, **options).eval()
        allowed = attn.pattern(45)[None, None] & mask[:, None, None, :]
        ref = dense_attention(q, k, v, allowed, scale=0.25)
        torch.testing.assert_close(attn(q, k, v, key_padding_mask=mask), ref, rtol=0, atol=1e-10)
        dropped = attn.train()(q, k, v, key_padding_mask=mask)
        assert torch.isfinite(dropped).all() and not torch.allclose(dropped, ref)


def test_bigbird_random_blocks_are_a_hash_of_the_seed_the_same_everywhere():
    """No Generator: the table is the same at every call whatever the global RNG, on meta too;
    causal, a block's random blocks do not depend on the length (bidirectional they do: its
    candidates include the blocks after its window)."""
    attn = build_attention("bigbird", causal=True, device="cpu", **SMALL_BIGBIRD, seed=7)
    torch.manual_seed(0)
    table = attn.random_blocks(40, "cpu")
    torch.manual_seed(1)
    assert table.equal(attn.random_blocks(40, "cpu"))
    assert table[:25].equal(attn.random_blocks(25, "cpu"))
    assert attn.random_blocks(40, "meta").shape == table.shape
    assert (table[6:] >= 0).all()  # from block 6 on, at least 2 candidates before the window
    many = build_attention("bigbird", causal=True, device="cpu", **SMALL_BIGBIRD, seed=2**40 + 7)
    assert not many.random_blocks(40, "cpu").equal(table)  # the seed's high bits count
    bidirectional = build_attention("bigbird", device="cpu", **SMALL_BIGBIRD, seed=7)
    counts = torch.bincount(bidirectional.random_blocks(400, "cpu").flatten(), minlength=400)
    assert counts[1:].max() <= 12  # spread over the candidates, not piled on a few


@pytest.mark.long
@pytest.mark.slow  # compiling takes ~3-6 s
def test_bigbird_compiles_to_one_graph_with_its_default_seed():
    q, k, v = (torch.randn(1, 2, 150, 16) for _ in range(3))
    for causal in (False, True):
        attn = build_attention("bigbird", causal=causal, device="cpu", block_size=32)
        assert attn.cfg.seed == 0
        torch._dynamo.reset()
        compiled = torch.compile(attn, backend="aot_eager", fullgraph=True)
        (out, grads), (ref, ref_grads) = (with_grads(f, [q, k, v]) for f in (compiled, attn))
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        for got, want in zip(grads, ref_grads):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_a_block_longer_than_the_input_costs_what_the_input_does():
    """One block: it is cut to the input's length (the pattern is the same), so block_size 2048
    at n = 10 costs what block_size 16 does, not 2048^2 scores."""
    q, k, v = (torch.randn(1, 2, 10, 16, requires_grad=True) for _ in range(3))
    peaks, outs = [], []
    for size in (16, 2048):
        attn = build_attention("bigbird", causal=True, device="cpu", block_size=size)
        out, peak = tracked_peak(lambda attn=attn: attn(q, k, v))
        _, backward = tracked_peak(lambda out=out: out.sum().backward())
        peaks.append(max(peak.peak_bytes, backward.peak_bytes))
        outs.append(out.detach())
    assert peaks[1] == peaks[0] and peaks[1] < 64 << 10, peaks
    torch.testing.assert_close(outs[1], outs[0], atol=0, rtol=0)


def _equals_the_dense_masked_softmax(attn, n: int, mask: torch.Tensor | None) -> None:
    """attn's outputs and gradients (float64) equal softmax under pattern(n) and the padding,
    on every query that sees a key."""
    q, k, v = (torch.randn(2, 2, n, 8, dtype=torch.float64) for _ in range(3))
    allowed = attn.pattern(n)[None, None]
    if mask is not None:
        allowed = allowed & mask[:, None, None, :]
    rows = allowed.any(-1, keepdim=True)

    def ours(q, k, v):
        return attn(q, k, v, key_padding_mask=mask) * rows

    def dense(q, k, v):
        return dense_attention(q, k, v, allowed, scale=8**-0.5) * rows

    (out, grads), (ref, ref_grads) = with_grads(ours, [q, k, v]), with_grads(dense, [q, k, v])
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-10)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("sliding-window", {"window": 5, "global_tokens": 6}),
        ("sliding-window", {"window": 64, "global_tokens": 50}),  # both >= n
        ("bigbird", {**SMALL_BIGBIRD, "num_global_blocks": 2}),
    ],
    ids=["band+global", "window,global>=n", "bigbird"],
)
def test_segment_by_segment_kernels_equal_the_dense_masked_softmax(monkeypatch, name, options):
    """A 1-byte scratch budget: one query block per segment, forward and backward, and the
    global rows' backward over many key segments; with and without padding, both modes."""
    from attention_zoo.attention.kernels.patterns import block_sparse

    monkeypatch.setattr(block_sparse, "SCRATCH_BYTES", 1)
    n = 37
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[0, 25:] = False
    mask[1, :3] = False
    for causal in (False, True):
        attn = build_attention(name, causal=causal, device="cpu", **options)
        for padding in (None, mask):
            _equals_the_dense_masked_softmax(attn, n, padding)
