"""ReformerConfig: validation messages, JSON round trip, options for built-in and user backends."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor

from attention_zoo import (
    ConfigError,
    OptionError,
    ReformerConfig,
    ReformerLM,
    ShapeError,
    UnknownNameError,
)
from attention_zoo.attention.base import AttentionCore
from attention_zoo.attention.spec import BACKENDS, Capabilities, get_backend, register_attention
from attention_zoo.config import hf_num_buckets

from .reformer_cases import need, tiny_config


def test_defaults_are_valid_with_local_and_lsh() -> None:
    need("local", "lsh")
    cfg = ReformerConfig()
    assert cfg.layer_backends() == ["local", "lsh"] * 3
    assert cfg.head_size == 64
    lsh = cfg.attention_options("lsh")
    assert lsh["chunk_length"] == cfg.lsh_attn_chunk_length and lsh["num_hashes"] == cfg.num_hashes
    assert lsh["seed"] is None
    assert cfg.attention_options("local")["chunk_length"] == cfg.local_attn_chunk_length


def test_json_round_trip_keeps_every_field() -> None:
    cfg = tiny_config(
        attn_layers=["full", "sdpa"],
        attn_options={"sdpa": {"kernel": "math"}},
        residual="checkpoint",
        chunk_size_feed_forward=5,
        num_buckets=[2, 4],
    )
    text = cfg.to_json()
    back = ReformerConfig.from_json(text)
    assert back == cfg
    assert json.loads(text)["attn_layers"] == ["full", "sdpa"]
    assert back.num_buckets == (2, 4) and back.attn_layers == ("full", "sdpa")
    assert ReformerConfig.from_dict(cfg.to_dict()) == cfg


def test_user_options_are_copied_not_aliased() -> None:
    opts = {"sdpa": {"kernel": "math"}}
    cfg = tiny_config(attn_layers=["sdpa"], attn_options=opts)
    opts["sdpa"]["kernel"] = "nonsense"
    assert cfg.attention_options("sdpa")["kernel"] == "math"


def test_from_dict_rejects_unknown_fields_and_lists_the_known_ones() -> None:
    with pytest.raises(
        ConfigError,
        match=r"does not take field\(s\) 'hiden_size'; it takes: .*did you mean 'hidden_size'",
    ):
        ReformerConfig.from_dict({**tiny_config().to_dict(), "hiden_size": 3})


@pytest.mark.parametrize(
    ("overrides", "error", "pattern"),
    [
        (
            {"attn_layers": ["fulll"]},
            UnknownNameError,
            r"unknown attention backend 'fulll'.*full.*sdpa",
        ),
        ({"attn_options": {"nope": {}}}, UnknownNameError, r"'nope'.*known attention backends"),
        (
            {"axial_pos_embds_dim": (6, 11)},
            ConfigError,
            r"sums to 17, but must sum to hidden_size 16",
        ),
        ({"axial_pos_shape": (4, 8, 1)}, ConfigError, r"same, non-zero number of factors"),
        (
            {"attn_layers": ["sdpa"], "attn_options": {"sdpa": {"window": 3}}},
            OptionError,
            r"'sdpa' does not take option\(s\) 'window'; it takes: kernel",
        ),
        (
            {"attn_options": {"full": {"chunk_length": 3}}},
            OptionError,
            r"'full' does not take option\(s\) 'chunk_length'",
        ),
        (
            {"hidden_size": 18, "axial_pos_embds_dim": (8, 10), "num_attention_heads": 4},
            ConfigError,
            r"18 is not divisible by num_attention_heads 4; "
            r"pick num_attention_heads among \[1, 2, 3, 6, 9, 18\]",
        ),
        (
            {"residual": "revnet"},
            UnknownNameError,
            r"unknown residual 'revnet'.*checkpoint, reversible, standard",
        ),
        ({"hidden_act": "gleu"}, ConfigError, r"unknown hidden_act 'gleu'; known: gelu, gelu_10"),
        ({"chunk_size_feed_forward": -1}, ConfigError, r"chunk_size_feed_forward must be an integ"),
        ({"chunk_size_feed_forward": 2.5}, ConfigError, r"chunk_size_feed_forward must be an"),
        ({"chunk_size_lm_head": -2}, ConfigError, r"chunk_size_lm_head must be an integer >= 0"),
        ({"pad_token_id": 40}, ConfigError, r"pad_token_id must be a token id \(0\.\.12\)"),
        ({"hidden_dropout_prob": 1.0}, ConfigError, r"hidden_dropout_prob must be in \[0, 1\)"),
        (
            {"lsh_attention_probs_dropout_prob": -0.1},
            ConfigError,
            r"lsh_attention_probs_dropout_prob must be in \[0, 1\)",
        ),
        ({"num_hidden_layers": 0}, ConfigError, r"num_hidden_layers must be an integer >= 1"),
        (
            {"attn_layers": ["full"] * 4, "num_hidden_layers": 3},
            ConfigError,
            r"attn_layers lists 4 layers, but num_hidden_layers=3; leave num_hidden_layers unset",
        ),
        ({"attn_layers": []}, ConfigError, r"at least one attention backend"),
        (
            {"previous_token_embeddings": "yes"},
            ConfigError,
            r"previous_token_embeddings must be true or false, got 'yes'",
        ),
    ],
)
def test_invalid_configs_say_what_would_work(overrides: dict, error: type, pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        tiny_config(**overrides)


def test_head_size_may_differ_from_hidden_over_heads() -> None:
    cfg = tiny_config(
        hidden_size=18, axial_pos_embds_dim=(8, 10), num_attention_heads=4, attention_head_size=5
    )
    model = ReformerLM(cfg)
    assert model.reformer.layers[0].attention.in_proj.weight.shape == (3 * 4 * 5, 18)


def test_standard_positions_need_no_axial_consistency() -> None:
    cfg = tiny_config(axial_pos_embds=False, axial_pos_shape=(3, 3), max_position_embeddings=40)
    assert cfg.max_position_embeddings == 40


def test_hf_named_fields_reach_lsh_and_attn_options_win() -> None:
    need("lsh")
    cfg = tiny_config(  # num_hashes at its default: attn_options decides
        attn_layers=["lsh"], num_hashes=1, hash_seed=7, attn_options={"lsh": {"num_hashes": 5}}
    )
    opts = cfg.attention_options("lsh")
    assert opts["num_hashes"] == 5 and opts["seed"] == 7 and opts["chunk_length"] == 4
    core = ReformerLM(cfg).reformer.layers[0].attention.core
    assert core.cfg.num_hashes == 5 and core.cfg.seed == 7
    # a field set away from its default and attn_options disagreeing: one would be ignored
    with pytest.raises(
        ConfigError, match=r"num_hashes=3 and attn_options\['lsh'\]\['num_hashes'\]=5"
    ):
        tiny_config(attn_layers=["lsh"], num_hashes=3, attn_options={"lsh": {"num_hashes": 5}})
    assert tiny_config(attn_layers=["lsh"], num_hashes=5, attn_options={"lsh": {"num_hashes": 5}})


def test_options_for_a_backend_no_layer_uses_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"options for 'sdpa', but no layer uses it"):
        tiny_config(attn_layers=["full"], attn_options={"sdpa": {"kernel": "math"}})


@dataclass(frozen=True, kw_only=True)
class _TemperatureConfig:
    temperature: float = 1.0


class _TemperatureAttention(AttentionCore):
    """Full softmax attention at a temperature (a user-registered test backend)."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=self.causal, scale=1 / self.cfg.temperature
        )


def test_options_reach_a_user_registered_backend() -> None:
    register_attention("test-temperature", config=_TemperatureConfig, caps=Capabilities())(
        _TemperatureAttention
    )
    try:
        cfg = tiny_config(
            attn_layers=["test-temperature"],
            attn_options={"test-temperature": {"temperature": 4.0}},
        )
        core = ReformerLM(cfg).reformer.layers[0].attention.core
        assert core.cfg.temperature == 4.0
        assert ReformerConfig.from_json(cfg.to_json()) == cfg
        with pytest.raises(OptionError, match="it takes: temperature"):
            tiny_config(
                attn_layers=["test-temperature"], attn_options={"test-temperature": {"temp": 4.0}}
            )
    finally:
        BACKENDS.remove("test-temperature")


def test_num_hidden_layers_follows_attn_layers_as_in_hf() -> None:
    assert ReformerConfig(attn_layers=["full"] * 12).num_hidden_layers == 12
    assert ReformerConfig().layer_backends() == ["local", "lsh"] * 3  # HF's default list
    cycled = tiny_config(attn_layers=["full", "sdpa"], num_hidden_layers=5)
    assert cycled.layer_backends() == ["full", "sdpa", "full", "sdpa", "full"]


def test_axial_product_and_max_positions_both_bound_the_length() -> None:
    """As HF: prod(axial_pos_shape) need not equal max_position_embeddings; both are limits."""
    ids = torch.zeros(1, 21, dtype=torch.long)
    small_max = ReformerLM(tiny_config(max_position_embeddings=20))  # axial product 32
    with pytest.raises(ShapeError, match="max_position_embeddings=20"):
        small_max(ids)
    assert small_max(ids[:, :20]).logits.shape == (1, 20, 13)
    large_max = ReformerLM(tiny_config(max_position_embeddings=40))
    assert large_max(torch.zeros(1, 32, dtype=torch.long)).logits.shape == (1, 32, 13)
    with pytest.raises(ShapeError, match=r"axial_pos_shape \(4, 8\) product"):
        large_max(torch.zeros(1, 33, dtype=torch.long))


def test_attention_dropout_fields_reach_each_backend() -> None:
    cfg = tiny_config(
        attn_layers=["full"],
        attention_probs_dropout_prob=0.0,
        local_attention_probs_dropout_prob=0.1,
        lsh_attention_probs_dropout_prob=0.2,
    )
    assert cfg.attention_dropout("local") == 0.1 and cfg.attention_dropout("lsh") == 0.2
    assert cfg.attention_dropout("full") == 0.0
    for backend, expected in (("local", 0.1), ("lsh", 0.2), ("full", 0.0)):
        if "dropout" in get_backend(backend).defaults():
            assert cfg.attention_options(backend)["dropout"] == expected


def test_num_buckets_none_is_hf_rule_at_max_positions() -> None:
    """Sized once from max_position_embeddings, never from a batch's (padded) length."""
    assert hf_num_buckets(4096, 64) == 128  # 2 * 4096 / 64
    assert hf_num_buckets(524_288, 64) == (128, 128)  # above 2 * max(sqrt(8192), 64): factorised
    assert hf_num_buckets(16, 64) == 2  # shorter than a chunk: the fewest buckets
    cfg = tiny_config(attn_layers=["lsh"], num_buckets=None, max_position_embeddings=32)
    assert cfg.attention_options("lsh")["num_buckets"] == (4, 4)  # 16 > 2 * max(2, 4)
    assert cfg.num_buckets is None  # the config still says "automatic"
    fixed = tiny_config(
        attn_layers=["lsh"], num_buckets=None, attn_options={"lsh": {"num_buckets": 8}}
    )
    assert fixed.attention_options("lsh")["num_buckets"] == 8


def test_attention_dropout_needs_a_backend_that_applies_it() -> None:
    register_attention("test-temperature", config=_TemperatureConfig, caps=Capabilities())(
        _TemperatureAttention
    )
    try:
        with pytest.raises(ConfigError, match=r"'test-temperature' has none; set it to 0"):
            tiny_config(attn_layers=["test-temperature"], attention_probs_dropout_prob=0.1)
    finally:
        BACKENDS.remove("test-temperature")
