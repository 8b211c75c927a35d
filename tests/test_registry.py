"""The registry: listing, building, user registration, and the errors bad input gets."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch

import attention_zoo as zoo
from attention_zoo import (
    AttentionCore,
    Capabilities,
    ConfigError,
    OptionError,
    SelfAttention,
    ShapeError,
    UnavailableError,
    UnknownNameError,
    ZooError,
    build_attention,
    list_backends,
    register_attention,
)
from attention_zoo.attention.spec import BACKENDS
from attention_zoo.attention.xformers import XFormersAttention, XFormersConfig
from attention_zoo.cli import main as zoo_main

BUILT_IN = ["full", "sdpa", "xformers", "shared-qk", "local", "lsh"]


def test_built_in_backends_are_registered_with_static_capabilities():
    names = [s.name for s in list_backends()]
    assert names[: len(BUILT_IN)] == BUILT_IN
    caps = {s.name: s.caps for s in list_backends()}
    assert caps["full"].exact and not caps["full"].shared_qk
    assert caps["shared-qk"].shared_qk and caps["shared-qk"].exact
    assert caps["xformers"].devices == frozenset({"cuda", "meta"})  # meta: counted, not run


def test_unknown_backend_lists_the_known_ones():
    with pytest.raises(UnknownNameError, match=r"unknown attention backend 'flsh'.*full.*sdpa"):
        build_attention("flsh")


def test_unknown_option_lists_accepted_options():
    with pytest.raises(
        OptionError, match=r"'sdpa' does not take option\(s\) 'chunk_length'; it takes: kernel"
    ):
        build_attention("sdpa", chunk_length=4)
    with pytest.raises(
        OptionError, match=r"'full' does not take option\(s\) 'num_hashes'; it takes: dropout"
    ):
        build_attention("full", num_hashes=2)


def test_bad_option_value_says_what_works():
    with pytest.raises(OptionError, match="auto, flash, efficient, cudnn, math"):
        build_attention("sdpa", kernel="fastest")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only message")
def test_xformers_is_unavailable_on_cpu_with_its_reason():
    spec = zoo.get_backend("xformers")
    assert "need CUDA" in spec.unavailable_reason("cpu")
    assert spec.describe("cpu")["available"] is False
    with pytest.raises(UnavailableError, match="xformers kernels need CUDA"):
        build_attention("xformers")


@pytest.mark.parametrize(
    "shapes, message",
    [
        (((2, 8, 16), (2, 8, 16), (2, 8, 16)), "rank 4"),
        (((1, 2, 8, 16), (1, 2, 9, 16), (1, 2, 8, 16)), "same .* shape"),
    ],
)
def test_wrong_rank_or_mismatched_shapes(shapes, message):
    attn = build_attention("full")
    with pytest.raises(ShapeError, match=message):
        attn(*(torch.randn(s) for s in shapes))


def test_bad_key_padding_mask():
    attn = build_attention("full")
    q = torch.randn(2, 2, 8, 4)
    with pytest.raises(
        ShapeError,
        match=r"key_padding_mask must be a bool tensor of shape \(batch, length\) = \(2, 8\)",
    ):
        attn(q, q, q, key_padding_mask=torch.ones(2, 8))


def test_hidden_not_divisible_by_heads():
    with pytest.raises(
        ConfigError, match=r"hidden_size 30 is not divisible by num_heads 4.*1, 2, 3, 5, 6"
    ):
        SelfAttention(30, 4)


def test_self_attention_checks_input_shape():
    with pytest.raises(ShapeError, match=r"\(batch, length, hidden_size=16\)"):
        SelfAttention(16, 2)(torch.randn(2, 5, 8))


@dataclass(frozen=True, kw_only=True)
class _WindowConfig:
    """Options of the test backend."""

    window: int = 3


def test_user_code_registers_a_backend_that_builds_and_lists():
    @register_attention("test-window", config=_WindowConfig, caps=Capabilities(exact=False))
    class WindowAttention(AttentionCore):
        """Each query sees the last `window` keys (toy)."""

        def attend(self, q, k, v, key_padding_mask):
            n = q.shape[-2]
            i = torch.arange(n)
            allowed = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < self.cfg.window)
            scores = (q @ k.transpose(-1, -2)).masked_fill(~allowed, -1e9)
            return scores.softmax(-1) @ v

    try:
        assert "test-window" in [s.name for s in list_backends()]
        attn = build_attention("test-window", causal=True, window=2)
        q = torch.randn(1, 1, 5, 4)
        assert attn(q, q, q).shape == q.shape
        block = SelfAttention(8, 2, "test-window", window=4)
        assert block(torch.randn(1, 5, 8)).shape == (1, 5, 8)
        with pytest.raises(OptionError, match="it takes: window"):
            build_attention("test-window", chunk=3)
        with pytest.raises(ZooError, match="already registered"):
            register_attention("test-window", config=_WindowConfig)(WindowAttention)
    finally:
        BACKENDS.remove("test-window")


def test_register_rejects_non_module_and_non_dataclass():
    with pytest.raises(TypeError, match="dataclass"):
        register_attention("bad", config=dict)
    with pytest.raises(TypeError, match=re.escape("nn.Module")):
        register_attention("bad", config=_WindowConfig)(object)
    assert "bad" not in BACKENDS


@pytest.mark.slow
def test_cli_list_table_and_json(capsys):
    assert zoo_main(["list", "--device", "cpu"]) == 0
    table = capsys.readouterr().out
    for name in [s.name for s in list_backends()]:
        assert name in table
    assert "no: xformers kernels need CUDA" in table
    assert zoo_main(["list", "--json", "--device", "cpu"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_name = {r["name"]: r for r in rows}
    assert by_name["xformers"]["available"] is False and "CUDA" in by_name["xformers"]["reason"]
    assert by_name["full"]["available"] is True and by_name["full"]["capabilities"]["exact"] is True


@pytest.mark.slow  # a fresh interpreter importing torch: ~2.5 s
def test_python_dash_m_entry_point():
    out = subprocess.run(
        [sys.executable, "-m", "attention_zoo", "list"], capture_output=True, text=True, check=True
    )
    assert "shared-qk" in out.stdout


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_xformers_bias_hides_padding_and_the_future_in_rows_aligned_to_8(causal):
    """xformers refuses a bias whose rows are not 8-aligned: at 37 keys its rows are 40 apart,
    and SDPA with that bias (the counted path) equals full attention under the padding."""
    core = XFormersAttention(XFormersConfig(), causal=causal)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 37, 16, generator=g) for _ in range(3))
    mask = torch.ones(2, 37, dtype=torch.bool)
    mask[0, 30:], mask[1, 20:24] = False, False
    bias = core._dense_bias(q, mask)
    assert bias.shape == (2, 3, 37, 37) and bias.stride(-2) == 40
    out = core._counted(q, k, v, mask)
    ref = zoo.build_attention("full", causal=causal, device="cpu")(q, k, v, key_padding_mask=mask)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
