"""ReformerConfig: validation messages, JSON round trip, options for built-in and user backends."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor

from attention_zoo import ConfigError, OptionError, ReformerConfig, ReformerLM, UnknownNameError
from attention_zoo.attention.base import AttentionCore
from attention_zoo.attention.spec import BACKENDS, Capabilities, register_attention

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
    assert cfg.attention_options("sdpa") == {"kernel": "math"}


def test_from_dict_rejects_unknown_fields_and_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"no field\(s\) 'hiden_size'.*hidden_size"):
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
        (
            {"axial_pos_shape": (4, 4)},
            ConfigError,
            r"product 16, but must equal max_position_embeddings 32",
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
            r"'full' does not take.*no options",
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
        ({"hidden_act": "gleu"}, ConfigError, r"unknown hidden_act 'gleu'; known: relu, gelu"),
        ({"chunk_size_feed_forward": -1}, ConfigError, r"chunk_size_feed_forward must be >= 0"),
        ({"hidden_dropout_prob": 1.0}, ConfigError, r"hidden_dropout_prob must be in \[0, 1\)"),
        ({"attention_probs_dropout_prob": 0.1}, ConfigError, r"'full' has none; set it to 0"),
        ({"num_hidden_layers": 0}, ConfigError, r"num_hidden_layers must be an integer >= 1"),
        ({"attn_layers": []}, ConfigError, r"at least one attention backend"),
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
    cfg = tiny_config(
        attn_layers=["lsh"], num_hashes=3, hash_seed=7, attn_options={"lsh": {"num_hashes": 5}}
    )
    opts = cfg.attention_options("lsh")
    assert opts["num_hashes"] == 5 and opts["seed"] == 7 and opts["chunk_length"] == 4
    core = ReformerLM(cfg).reformer.layers[0].attention.core
    assert core.cfg.num_hashes == 5 and core.cfg.seed == 7


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
