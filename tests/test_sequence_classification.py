"""ReformerForSequenceClassification: transformers' class of that name, weights in and out."""

from __future__ import annotations

import warnings

import pytest
import torch

from attention_zoo import ConfigError, ReformerConfig, ReformerForSequenceClassification
from attention_zoo.errors import ShapeError
from attention_zoo.hf_reformer import HFConversionWarning

from .hf_parity import BASE, ENCODER_CASES

transformers = pytest.importorskip("transformers", reason="the HF parity tests need transformers")

ENCODER = {**BASE, **ENCODER_CASES[0].hf}  # local + lsh, bidirectional


def _hf_classifier(num_labels: int = 5):
    torch.manual_seed(0)
    config = transformers.ReformerConfig(**ENCODER, num_labels=num_labels)
    return transformers.ReformerForSequenceClassification(config).eval()


@pytest.mark.slow
def test_from_hf_computes_what_transformers_computes_and_to_hf_round_trips() -> None:
    hf = _hf_classifier()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HFConversionWarning)
        ours = ReformerForSequenceClassification.from_hf(hf).eval()
        back = ours.to_hf()
    assert ours.num_labels == 5 and back.config.num_labels == 5
    assert back.state_dict().keys() == hf.state_dict().keys()
    for name, tensor in hf.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name
    ids = torch.randint(0, BASE["vocab_size"], (3, 16), generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([0, 4, 2])
    mine, theirs = ours(ids, labels=labels), hf(ids, labels=labels)
    assert mine.logits.shape == (3, 5)
    torch.testing.assert_close(mine.logits, theirs.logits, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(mine.loss, theirs.loss, atol=1e-6, rtol=1e-5)


def test_head_reads_the_first_token_only_and_refuses_causal_and_bad_labels() -> None:
    config = ReformerConfig(
        vocab_size=7, hidden_size=16, num_attention_heads=2, feed_forward_size=32,
        attn_layers=("full",), axial_pos_embds=False, max_position_embeddings=8,
        hidden_dropout_prob=0.0, residual="standard",
    )  # fmt: skip
    model = ReformerForSequenceClassification(config, num_labels=3).eval()
    hidden = torch.randn(2, 8, 32)
    changed = hidden.clone()
    changed[:, 1:] = 0.0
    torch.testing.assert_close(model.classifier(hidden), model.classifier(changed))
    with pytest.raises(ConfigError, match="set is_decoder=False"):
        ReformerForSequenceClassification(config.replace(is_decoder=True))
    with pytest.raises(ShapeError, match=r"one class id per sequence, shape \(2,\)"):
        model(torch.zeros(2, 8, dtype=torch.long), labels=torch.zeros(2, 8, dtype=torch.long))


@pytest.mark.slow  # builds through the measurement stack (~3 s of first-use imports)
def test_a_bidirectional_model_case_is_measured_as_a_sequence_classifier() -> None:
    from attention_zoo.measure.cases import CLASSIFIER_LABELS, BenchCase, build_runnable
    from attention_zoo.measure.validate import invalid_output

    case = BenchCase(
        target="model", backend="nystrom", seq_len=16, batch=2, num_heads=2, head_dim=8,
        hidden=16, causal=False, mode="train-step",
        model={"vocab_size": 11, "num_hidden_layers": 1},
    )  # fmt: skip
    runnable = build_runnable(case, "cpu")
    assert isinstance(runnable.module, ReformerForSequenceClassification)
    assert runnable.output().shape == (2, CLASSIFIER_LABELS)
    assert invalid_output(runnable) is None
    runnable.step()  # a training step with its loss


def test_the_encoder_alone_from_a_classifiers_state_dict() -> None:
    from attention_zoo import ReformerModel

    hf = _hf_classifier()
    with pytest.warns(
        HFConversionWarning, match=r"ignores the classifier's weights \(classifier\."
    ):
        encoder = ReformerModel.from_hf(hf.state_dict(), config=hf.config)
    ids = torch.randint(0, BASE["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(
        encoder.eval()(ids).last_hidden_state, hf.reformer(ids).last_hidden_state
    )
