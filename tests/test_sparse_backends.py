"""sliding-window and bigbird: their patterns, options, seeds and memory (the conformance suite
checks them against a dense masked softmax); bidirectional-only backends refuse causal runs."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from attention_zoo import ReformerConfig, build_attention
from attention_zoo.attention import BACKENDS, AttentionCore, Capabilities, register_attention
from attention_zoo.attention.spec import get_backend
from attention_zoo.errors import ConfigError, OptionError
from attention_zoo.measure.tracker import tracked_peak

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
        ("bigbird", {"seed": -1}, "bigbird option seed must be an int >= 0, got -1"),
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
    small, large = (_fwd_bwd_peak(name, n, **options) for n in (1024, 2048))
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
        with pytest.raises(ConfigError, match=r"causal backend: full, sdpa.*is_decoder=True"):
            ReformerConfig(attn_layers=["test-bidirectional"], is_decoder=True)
    finally:
        BACKENDS.remove("test-bidirectional")


@pytest.mark.parametrize("name", ["sliding-window", "bigbird"])
def test_the_sdpa_path_off_cpu_kernels_equals_the_pattern(monkeypatch, name):
    """The path taken on CUDA and with dropout (every block at once through SDPA), batch 2 with
    padding, in float64: the pattern's dense masked softmax, and dropout only in training."""
    from attention_zoo.attention import sliding_window
    from attention_zoo.attention.kernels import block_sparse
    from attention_zoo.attention.kernels.dense import dense_attention

    options = {"window": 8, "global_tokens": 3} if name == "sliding-window" else SMALL_BIGBIRD
    for module in (sliding_window, block_sparse):
        monkeypatch.setattr(module, "resolve_kernel", lambda *args: "math")
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
