"""A model case measures the depth its case key meant: 6 layers unless its model says otherwise."""

from __future__ import annotations

from attention_zoo.measure.cases import MODEL_CASE_LAYERS, BenchCase


def test_a_model_case_without_a_depth_builds_six_layers():
    config = BenchCase(target="model", backend="lsh", seq_len=64).reformer_config()
    assert MODEL_CASE_LAYERS == 6
    assert config.num_hidden_layers == 6 and config.layer_backends() == ["lsh"] * 6


def test_the_model_dict_sets_the_depth_and_the_layer_mix():
    mixed = BenchCase(target="model", backend="local+lsh", seq_len=64,
                      model={"attn_layers": ["local", "lsh"]})  # fmt: skip
    assert mixed.reformer_config().num_hidden_layers == 6
    two = BenchCase(target="model", backend="lsh", seq_len=64, model={"num_hidden_layers": 2})
    assert two.reformer_config().num_hidden_layers == 2
