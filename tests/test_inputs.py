"""The declared input contract (attention/inputs.py): what a backend takes, shared KV heads, extra
inputs, and the numbers a fair comparison holds equal (measure/fair.py)."""

from __future__ import annotations

import json

import pytest
import torch

from attention_zoo import SelfAttention, build_attention
from attention_zoo.attention import decode
from attention_zoo.attention.dispatch import Call
from attention_zoo.attention.inputs import Extra, InputLayout, expand_kv
from attention_zoo.attention.kernels.recurrences.table import RECURRENCE_KERNELS
from attention_zoo.attention.spec import get_backend
from attention_zoo.cli import main
from attention_zoo.commands import list_cmd
from attention_zoo.errors import ConfigError, OptionError, ShapeError, UnavailableError
from attention_zoo.measure.fair import FairSetting, fair_numbers

GROUPED = ("full", "sdpa", "local", "sliding-window", "bigbird", "moba")


def test_a_layout_says_what_the_block_projects():
    layout = InputLayout(kv_heads=2, expand_v=2, extras=(Extra("g", torch.sigmoid, True),))
    assert layout.projections(8, 16) == {"q": 128, "k": 32, "v": 64, "g": 128}
    assert InputLayout(shared_qk=True).projections(4, 8) == {"q": 32, "v": 32}
    with pytest.raises(ConfigError, match="kv_heads=3 must divide the 8 query heads"):
        layout.__class__(kv_heads=3).projections(8, 16)


@pytest.mark.parametrize(
    ("backend", "options", "low", "high"),
    [("gla", {"gate": "scalar"}, None, 0.0), ("deltanet", {}, 0.0, 1.0)],
)
def test_sampled_extras_lie_where_the_recurrence_is_stable(backend, options, low, high):
    """Decays are sampled <= 0 and step sizes in (0, 1) (not raw Gaussians, which blow a
    recurrence up), and (0, 2) with negative eigenvalues."""
    x = get_backend(backend).layout(**options).sample(2, 3, 500, 8)
    (value,) = x.extras.values()
    assert value.shape == (2, 3, 500)
    assert (low is None or bool((value > low).all())) and bool((value < high).all())
    beta = get_backend("deltanet").layout(negative_eigenvalues=True).sample(1, 2, 500, 8)
    assert float(beta.extras["beta"].max()) > 1.0 and float(beta.extras["beta"].max()) < 2.0


def test_extras_alone_are_drawn_as_a_whole_sample_draws_them():
    """sample_extras continues the caller's generator as sample does after q, k, v."""
    layout = get_backend("gated-deltanet").layout()
    x = layout.sample(2, 3, 50, 8, generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):  # q, k, v
        torch.randn(2, 3, 50, 8, generator=gen)
    extras = layout.sample_extras(torch.empty(2, 3, 50, 8), generator=gen)
    assert sorted(extras) == ["beta", "log_decay"]
    for name, value in extras.items():
        torch.testing.assert_close(value, x.extras[name], atol=0, rtol=0)


@pytest.mark.parametrize("name", GROUPED)
def test_shared_kv_heads_equal_repeated_keys_and_values(name):
    """kv_heads=2 of 4 query heads: the same as full attention over keys and values repeated to
    every query head of their group (float64, causal)."""
    core = build_attention(name, causal=True, device="cpu", kv_heads=2)
    full = build_attention("full", causal=True, device="cpu")
    q = torch.randn(2, 4, 40, 8, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 40, 8, dtype=torch.float64) for _ in range(2))
    want = full(q, expand_kv(q, k), expand_kv(q, v))
    if name in ("local", "sliding-window", "bigbird", "moba"):  # compare under their own selection
        same = build_attention(name, causal=True, device="cpu")
        want = same(q, expand_kv(q, k), expand_kv(q, v))
    torch.testing.assert_close(core(q, k, v), want, atol=1e-10, rtol=1e-10)


def test_keys_with_the_wrong_head_count_are_refused_in_one_line():
    core = build_attention("sdpa", causal=True, device="cpu", kv_heads=2)
    q, k = torch.randn(1, 4, 8, 8), torch.randn(1, 4, 8, 8)
    with pytest.raises(ShapeError, match=r"k must be \(1, 2, 8, 8\)") as info:
        core(q, k, k)
    assert "\n" not in str(info.value)
    plain = build_attention("sdpa", causal=True, device="cpu")
    with pytest.raises(ShapeError, match="same"):
        plain(q, k[:, :2], k[:, :2])


def test_a_backend_without_shared_kv_heads_refuses_them_in_one_line():
    with pytest.raises(OptionError, match=r"'lsh' takes no kv_heads.*shares q and k") as info:
        build_attention("lsh", kv_heads=1, device="cpu")
    assert "\n" not in str(info.value) and "sdpa" in str(info.value)


def test_a_named_kernel_without_shared_kv_heads_refuses_and_auto_falls_back():
    q, k = torch.randn(1, 4, 64, 8), torch.randn(1, 1, 64, 8)
    fused = build_attention("local", causal=True, device="cpu", kv_heads=1, kernel="cpu-fused")
    with pytest.raises(UnavailableError, match=r"takes no shared KV heads.*picks math"):
        fused(q, k, k)
    auto = build_attention("local", causal=True, device="cpu", kv_heads=1)
    assert auto.kernel_for(q, None, k).name == "math"


def test_a_block_with_shared_kv_heads_projects_fewer_keys_and_decodes():
    """kv_heads=1 of 4: the block's key and value maps shrink to one head, and its decoding state
    (a KV cache) to a quarter; prefill + steps equal the forward."""
    grouped = SelfAttention(64, 4, "sdpa", causal=True, kv_heads=1).double().eval()
    plain = SelfAttention(64, 4, "sdpa", causal=True)
    assert grouped.in_proj.weight.shape == (64 + 16 + 16, 64)
    assert plain.in_proj.weight.shape == (3 * 64, 64)
    x = torch.randn(2, 11, 64, dtype=torch.float64)
    state = grouped.init_state(2, 11)
    first, state = grouped.step(x[:, :7], state)
    rest, state = grouped.step(x[:, 7:], state)
    torch.testing.assert_close(torch.cat([first, rest], 1), grouped(x), atol=1e-10, rtol=1e-10)
    real = 2 * 11  # the bools saying which cached keys are real: one per position either way
    assert 4 * (state.nbytes() - real) == plain.double().init_state(2, 11).nbytes() - real


@pytest.mark.slow
def test_fair_numbers_follow_the_layout():
    """One KV head of four: a quarter of the KV cache and fewer parameters; a recurrence's state
    does not grow with the context."""
    setting = FairSetting(context=65536)
    mha, mqa = fair_numbers("sdpa", {}, setting), fair_numbers("sdpa", {"kv_heads": 1}, setting)
    shape = decode.StateShape(1, 4, 64, 65536)
    assert mha.state_bytes == decode.kv_cache_bytes(shape)
    assert mqa.state_bytes == decode.kv_cache_bytes(decode.StateShape(1, 4, 64, 65536, kv_heads=1))
    assert 4 * (mqa.state_bytes - 65536) == mha.state_bytes - 65536  # the real-key bools stay
    assert mqa.params < mha.params
    assert fair_numbers("linear", {}, FairSetting(context=1024)).state_bytes == (
        fair_numbers("linear", {}, setting).state_bytes
    )
    assert fair_numbers("nystrom", {}, setting).state_bytes is None  # bidirectional only


def test_fair_numbers_past_int64_sizes_are_a_zoo_error_left_blank():
    """Before: n x n scores at 2**31 - 1 positions overflowed torch's sizes and `zoo list
    --context` ended in a RuntimeError traceback; a ShapeError is what _fair leaves blank."""
    setting = FairSetting(context=2**31 - 1)
    for backend in ("full", "linear"):  # materialised scores; feature maps (numel overflows)
        with pytest.raises(ShapeError, match=rf"^{backend} at 2147483647 positions is too large"):
            fair_numbers(backend, {}, setting)
    assert list_cmd._fair("full", setting) is None


@pytest.mark.slow
def test_zoo_list_shows_the_fair_numbers(capsys):
    assert main(["list", "--json", "--device", "cpu", "--context", "2048"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["sdpa"]["fair"]["setting"]["context"] == 2048
    assert rows["sdpa"]["fair"]["state_bytes"] == decode.kv_cache_bytes(
        decode.StateShape(1, 4, 64, 2048)
    )
    # xformers' kernels need CUDA, yet its numbers are counted on shapes: SDPA's computation,
    # its own decoding (the recomputed prefix: q, k and v)
    xformers, sdpa = rows["xformers"]["fair"], rows["sdpa"]["fair"]
    assert xformers["params"] == sdpa["params"]
    assert xformers["flops_per_token"] == sdpa["flops_per_token"]
    assert xformers["state_bytes"] > sdpa["state_bytes"]
    assert main(["list", "--device", "cpu"]) == 0
    assert "state/seq @4096" in capsys.readouterr().out


def test_fla_is_refused_where_its_kernels_would_fail():
    """fla runs bfloat16 only (its float32 products are TF32): auto then picks our chunks on CUDA.
    Its chunk sizes, odd widths (its 16-bit backward) and the delta rule's widest keys too."""
    fla = RECURRENCE_KERNELS.by_name["fla"]
    call = Call("cuda", torch.bfloat16, 4096, 64)
    for name in ("retention", "gla", "deltanet", "gated-deltanet"):
        core = build_attention(name, causal=True, device="cpu")
        for dtype in (torch.float32, torch.float16):
            wide = Call("cuda", dtype, 4096, 64)
            assert f"takes bfloat16, not {str(dtype)[6:]}" in fla.reasons(core, wide)
        assert not any("bfloat16" in r or "fla's" in r for r in fla.reasons(core, call)), name
    # fla's delta-rule kernels take chunks of 16, 32 or 64 tokens; its decays any of ours
    for name, chunk, refused in [("gated-deltanet", 8, True), ("gated-deltanet", 128, True),
                                 ("gated-deltanet", 32, False), ("gla", 8, False)]:  # fmt: skip
        core = build_attention(name, causal=True, device="cpu", chunk_length=chunk)
        assert any("chunk_length 16, 32 or 64" in r for r in fla.reasons(core, call)) == refused
    odd = build_attention("gla", causal=True, device="cpu")
    assert "fla's 16-bit backward needs even key and value widths, not 63 and 63" in fla.reasons(
        odd, Call("cuda", torch.bfloat16, 4096, 63)
    )
    wide_keys = Call("cuda", torch.bfloat16, 4096, 512)
    delta = build_attention("deltanet", causal=True, device="cpu")
    assert "fla's delta-rule kernels take key widths up to 256, not 512" in fla.reasons(
        delta, wide_keys
    )
    assert not any("key widths" in r for r in fla.reasons(odd, wide_keys))


def test_recurrences_take_chunks_of_a_power_of_two():
    with pytest.raises(OptionError, match=r"retention option chunk_length must be a power of two"):
        build_attention("retention", causal=True, chunk_length=48)


def test_a_case_s_call_carries_its_shared_kv_heads():
    """The kernel a case reports is picked for its call as run: four query heads per key/value
    head under kv_heads=1."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from attention_zoo.measure.cases import BenchCase, build_runnable
    from attention_zoo.measure.kernels import attention_cores, case_call

    for kv_heads, group in ((None, 1), (1, 4), (2, 2)):
        case = BenchCase(target="attention", backend="sdpa", seq_len=64,
                         options={"kv_heads": kv_heads})  # fmt: skip
        with FakeTensorMode():
            (core,) = attention_cores(build_runnable(case, "meta").module)
        assert case_call(case, core).group == group
