"""Hugging Face Reformer in and out: config fields, weights, files, and parity with transformers."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from attention_zoo import ConfigError, ReformerConfig, ReformerLM, ReformerModel
from attention_zoo.attention.spec import get_backend
from attention_zoo.blocks.feedforward import ACTIVATIONS
from attention_zoo.config import hf_num_buckets
from attention_zoo.hf_reformer import SAME_FIELDS, HFConversionWarning

from .hf_parity import (
    BASE,
    CASES,
    ENCODER_CASES,
    TOLERANCE,
    ParityCase,
    compare,
    hf_semantics_missing,
)

# its Reformer classes load on first use, in the tests, not while the tests are collected
transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed: the HF parity tests need it"
)


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors: extra threads only add overhead (10x on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _need_option(option: str, *backends: str) -> None:
    """Skip until the attention cores take `option` (HF's configs need attention dropout)."""
    missing = [b for b in backends if option not in get_backend(b).defaults()]
    if missing:
        pytest.skip(f"the {', '.join(missing)} core(s) have no {option!r} option yet")


def _quiet_from_hf(source, **kw) -> ReformerLM:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HFConversionWarning)
        return ReformerLM.from_hf(source, **kw)


def _hf_model(**overrides) -> transformers.ReformerModelWithLMHead:
    torch.manual_seed(0)
    return transformers.ReformerModelWithLMHead(
        transformers.ReformerConfig(**{**BASE, "attn_layers": ["local", "lsh"], **overrides})
    )


def _assert_same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name


# ---- parity --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case", CASES + ENCODER_CASES, ids=lambda c: c.name)
def test_from_hf_computes_what_transformers_computes(case: ParityCase, dtype: torch.dtype) -> None:
    if reason := hf_semantics_missing(case):
        pytest.skip(reason)
    errors = compare(case, dtype)
    assert errors["grad_params"] >= 10  # every projection, norm, FFN and embedding weight
    limits = TOLERANCE[dtype]
    bad = {k: errors[k] for k, limit in limits.items() if k in errors and errors[k] > limit}
    assert not bad, f"relative errors above tolerance: {bad} (all: {errors})"


# ---- round trip ----------------------------------------------------------------------------------


def test_to_hf_round_trips_bit_exactly() -> None:
    hf = _hf_model(num_buckets=[2, 4], hash_seed=3).double()
    ours = _quiet_from_hf(hf)
    assert next(ours.parameters()).dtype == torch.float64
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HFConversionWarning)
        back = ours.to_hf()
    _assert_same_state(back.state_dict(), hf.state_dict())
    original, returned = hf.config.to_dict(), back.config.to_dict()
    for name in [*SAME_FIELDS, "num_hidden_layers", "eos_token_id", "use_cache"]:
        assert returned[name] == original[name], name


def test_our_own_model_goes_to_hf_and_back() -> None:
    cfg = ReformerConfig(**{**BASE, "attn_layers": ("local", "lsh"), "num_buckets": 4})
    ours = ReformerLM(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HFConversionWarning)
        hf = ours.to_hf()
    again = _quiet_from_hf(hf)
    _assert_same_state(again.state_dict(), ours.state_dict())
    with pytest.raises(ConfigError, match="HF's Reformer is reversible"):
        ReformerLM(cfg.replace(residual="standard")).to_hf()
    with pytest.raises(ConfigError, match="only 'local' and 'lsh' attention; layers use full"):
        ReformerLM(cfg.replace(attn_layers=("full", "lsh"))).to_hf()
    with pytest.raises(ConfigError, match=r"adds the previous token's embedding"):
        ReformerLM(cfg.replace(previous_token_embeddings=True)).to_hf()
    shared = cfg.replace(attn_options={"local": {"kv_heads": 1}})
    with pytest.raises(ConfigError, match=r"'local' layers share them over kv_heads=1"):
        ReformerLM(shared).to_hf()  # not a raw state-dict error from an equal three-way split


def test_from_a_saved_folder_and_a_state_dict(tmp_path) -> None:
    hf = _hf_model(num_buckets=4)
    hf.save_pretrained(tmp_path / "safe")
    from_folder = _quiet_from_hf(tmp_path / "safe")
    _assert_same_state(from_folder.state_dict(), _quiet_from_hf(hf).state_dict())
    # pytorch_model.bin, as older checkpoints have it
    (tmp_path / "bin").mkdir()
    torch.save(hf.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    (tmp_path / "bin" / "config.json").write_text(json.dumps(hf.config.to_dict()))
    _assert_same_state(_quiet_from_hf(tmp_path / "bin").state_dict(), from_folder.state_dict())
    from_state = _quiet_from_hf(hf.state_dict(), config=tmp_path / "safe" / "config.json")
    _assert_same_state(from_state.state_dict(), from_folder.state_dict())
    with pytest.raises(ConfigError, match=r"needs config="):
        ReformerLM.from_hf(hf.state_dict())
    with pytest.raises(ConfigError, match=r"no weights in .*expected model.safetensors"):
        _quiet_from_hf(tmp_path)  # no config.json there either: weights are looked for first


def test_from_hf_puts_the_model_on_the_device_asked_for() -> None:
    ours = _quiet_from_hf(_hf_model(num_buckets=4), device="meta")
    assert {p.device.type for p in ours.parameters()} == {"meta"}


def test_mismatched_weights_are_refused() -> None:
    hf = _hf_model(num_buckets=4)
    state = hf.state_dict()
    with pytest.raises(ConfigError, match=r"layer 0 is 'lsh'.*attn_layers does not match"):
        _quiet_from_hf(state, config={**hf.config.to_dict(), "attn_layers": ["lsh", "lsh"]})
    state["reformer.encoder.extra.weight"] = torch.zeros(1)
    with pytest.raises(ConfigError, match="names a ReformerModelWithLMHead does not"):
        _quiet_from_hf(state, config=hf.config)


def test_encoder_from_hf_reformer_model() -> None:
    torch.manual_seed(0)
    cfg = transformers.ReformerConfig(**{**BASE, "attn_layers": ["local"]})
    hf = transformers.ReformerModel(cfg).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HFConversionWarning)
        ours = ReformerModel.from_hf(hf).eval()
        back = ours.to_hf()
    _assert_same_state(back.state_dict(), hf.state_dict())
    ids = torch.randint(0, 11, (2, 16))
    torch.testing.assert_close(
        ours(ids).last_hidden_state, hf(ids).last_hidden_state, atol=1e-6, rtol=1e-5
    )


def test_encoder_from_the_state_dict_of_a_model_with_lm_head() -> None:
    hf = _hf_model(num_buckets=4)
    with pytest.warns(HFConversionWarning, match=r"ignores the LM head's weights \(lm_head\."):
        ours = ReformerModel.from_hf(hf.state_dict(), config=hf.config)
    _assert_same_state(ours.state_dict(), _quiet_from_hf(hf).reformer.state_dict())


# ---- config fields -------------------------------------------------------------------------------


def test_every_hf_config_field_is_honoured_or_kept() -> None:
    _need_option("dropout", "local")  # HF's default local attention dropout is 0.05
    data = transformers.ReformerConfig().to_dict()
    with pytest.warns(HFConversionWarning, match="kept for to_hf") as caught:
        cfg = ReformerConfig.from_hf(data)
    named = str(caught[-1].message)
    for name, value in data.items():
        if name in SAME_FIELDS:
            ours = getattr(cfg, name)
            assert (list(ours) if isinstance(ours, tuple) else ours) == value, name
        elif name == "num_hidden_layers":
            assert cfg.num_hidden_layers == value == len(data["attn_layers"])
        elif name == "model_type":
            assert value == "reformer"  # checked, not kept
        else:
            assert cfg.hf_extra[name] == value, name
            if not name.startswith("_") and name not in ("transformers_version", "model_type"):
                assert name in named, name
    assert cfg.residual == "reversible"


def test_hf_defaults_are_made_explicit() -> None:
    """Fields missing from an HF config mean HF's defaults, not ours."""
    _need_option("dropout", "local")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HFConversionWarning)
        cfg = ReformerConfig.from_hf({"attn_layers": ["local", "lsh"], "hidden_size": 256})
    assert cfg.num_attention_heads == 12 and cfg.attention_head_size == 64
    assert cfg.axial_norm_std == 1.0 and cfg.num_hidden_layers == 2
    assert cfg.local_attention_probs_dropout_prob == 0.05
    assert cfg.lsh_attention_probs_dropout_prob == 0.0


def test_from_hf_reads_a_config_json_path(tmp_path) -> None:
    transformers.ReformerConfig(**BASE, attn_layers=["lsh"], num_buckets=[2, 4]).save_pretrained(
        tmp_path
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HFConversionWarning)
        by_folder = ReformerConfig.from_hf(tmp_path)
        by_file = ReformerConfig.from_hf(tmp_path / "config.json")
    assert by_folder == by_file and by_folder.num_buckets == (2, 4)
    with pytest.raises(ConfigError, match="no Hugging Face config at"):
        ReformerConfig.from_hf(tmp_path / "missing.json")


def test_translated_fields() -> None:
    data = {**BASE, "attn_layers": ["local"] * 4 + ["lsh"] * 8, "num_hidden_layers": 6}
    data["num_buckets"] = [4, 2]
    data["local_attention_probs_dropout_prob"] = 0.0
    with pytest.warns(HFConversionWarning, match=r"num_hidden_layers=6 ignored.*12 layers"):
        cfg = ReformerConfig.from_hf(data)
    assert cfg.num_hidden_layers == 12 and cfg.layer_backends()[4:] == ["lsh"] * 8
    assert cfg.num_buckets == (4, 2) and cfg.residual == "reversible"
    assert cfg.attention_probs_dropout_prob == 0.0  # local/lsh use their own HF fields
    for backend in ("local", "lsh"):
        if "semantics" in cfg.attention_options(backend) or "semantics" in cfg.attn_options.get(
            backend, {}
        ):
            assert cfg.attention_options(backend)["semantics"] == "hf"


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        ({"model_type": "bert"}, "not a Reformer config: model_type is 'bert'"),
        ({"is_encoder_decoder": True}, "encoder or a decoder only"),
        ({"attn_layers": ["local", "full"]}, r"non-empty list of 'local' and 'lsh' \(got 'full'\)"),
        ({"attn_layers": []}, "non-empty list"),
        ({"hidden_act": "prelu"}, "unknown hidden_act 'prelu'"),
        ({"hidden_act": torch.relu}, "hidden_act .* is a function"),
        ({"axial_pos_embds_dim": [6, 6]}, "must sum to hidden_size 16"),
    ],
)
def test_rejected_fields_say_why(change: dict, pattern: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HFConversionWarning)
        with pytest.raises(ConfigError, match=pattern):
            ReformerConfig.from_hf({**BASE, "attn_layers": ["local"], **change})


@pytest.mark.parametrize(("max_positions", "chunk"), [(32, 4), (4096, 64), (524_288, 64), (96, 8)])
def test_auto_buckets_equal_hf_rule(max_positions: int, chunk: int) -> None:
    """HF sizes num_buckets=None at its first batch; at max_position_embeddings it is ours."""
    cfg = transformers.ReformerConfig(
        attn_layers=["lsh"], lsh_attn_chunk_length=chunk, max_position_embeddings=max_positions
    )
    attention = transformers.models.reformer.modeling_reformer.LSHSelfAttention(cfg)
    attention._set_num_buckets(max_positions)
    expected = attention.num_buckets
    ours = hf_num_buckets(max_positions, chunk)
    assert (list(ours) if isinstance(ours, tuple) else ours) == expected


def test_auto_buckets_follow_the_chunk_length_in_attn_options() -> None:
    cfg = ReformerConfig(
        attn_layers=("lsh",),
        max_position_embeddings=4096,
        attn_options={"lsh": {"chunk_length": 32}},
    )
    assert cfg.attention_options("lsh")["num_buckets"] == hf_num_buckets(4096, 32) == (16, 16)
    assert hf_num_buckets(4096, cfg.lsh_attn_chunk_length) == 128


def test_activations_are_transformers_own() -> None:
    hf_names = set(transformers.activations.ACT2CLS) - {"prelu", "xielu"}  # learned parameters
    assert hf_names <= set(ACTIVATIONS)
    x = torch.linspace(-12, 12, 1001, dtype=torch.float64)
    for name in sorted(hf_names):
        torch.testing.assert_close(
            ACTIVATIONS[name](x), transformers.activations.ACT2FN[name](x), msg=name
        )


def test_a_bias_transformers_ignores_is_named() -> None:
    """transformers 5 builds lm_head.decoder without a bias and never adds lm_head.bias; the loaded
    model adds it (as trained with transformers 4.x), so a nonzero one is named in a warning."""
    hf = _hf_model(num_buckets=4)
    if hf.lm_head.decoder.bias is not None:
        pytest.skip("this transformers version's decoder has a bias of its own")
    with torch.no_grad():
        hf.lm_head.bias.fill_(0.5)
    with pytest.warns(HFConversionWarning, match="ignores lm_head.bias"):
        ours = ReformerLM.from_hf(hf)
    assert torch.equal(ours.lm_head.bias, hf.lm_head.bias)


def test_the_decoder_bias_is_the_one_applied() -> None:
    """transformers 5.24 on applies lm_head.decoder.bias and leaves lm_head.bias unused: the
    loaded model takes the decoder's, gives HF's logits, and to_hf puts it back."""
    hf = _hf_model(attn_layers=["local"]).eval()  # no random rotations: logits comparable
    if hf.lm_head.decoder.bias is None:
        pytest.skip("this transformers version's decoder has no bias")
    with torch.no_grad():
        hf.lm_head.decoder.bias.copy_(torch.randn_like(hf.lm_head.decoder.bias))
        hf.lm_head.bias.fill_(0.5)
    ours = _quiet_from_hf(hf).eval()
    assert torch.equal(ours.lm_head.bias, hf.lm_head.decoder.bias)
    ids = torch.randint(0, BASE["vocab_size"], (1, 16))
    torch.testing.assert_close(ours(ids).logits, hf(ids).logits, atol=1e-5, rtol=1e-5)
    assert torch.equal(ours.to_hf().lm_head.decoder.bias, hf.lm_head.decoder.bias)


def test_lm_head_chunks_change_nothing() -> None:
    cfg = ReformerConfig(**{**BASE, "attn_layers": ("local",), "chunk_size_lm_head": 3})
    chunked = ReformerLM(cfg).eval()
    whole = ReformerLM(cfg.replace(chunk_size_lm_head=0)).eval()
    whole.load_state_dict(chunked.state_dict())
    ids = torch.randint(0, 11, (2, 13))
    torch.testing.assert_close(chunked(ids).logits, whole(ids).logits)
