"""What the trainer reads of a batch: ListOps padding masked as keys in every backend, and a
language model's logits computed only at the scored positions, with the full logits' loss."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import Tensor

from attention_zoo.config import ReformerConfig
from attention_zoo.model import ReformerLM
from attention_zoo.reproduce.base import OWN_SETTINGS
from attention_zoo.reproduce.lra_listops.settings import LRA_SETTINGS, listops_preset
from attention_zoo.tasks.associative_recall import AssociativeRecallTask
from attention_zoo.tasks.base import Batch
from attention_zoo.tasks.listops import PAD, TOKEN_ID
from attention_zoo.tasks.runner import RunSpec, build_model, plan_runs
from attention_zoo.tasks.trainer import batch_loss, logits_of, scored_loss


def _padding_gradient(spec: RunSpec, batch: Batch) -> float:
    """The largest gradient of the trainer's loss on `batch` with respect to the token embeddings
    at its padding positions: zero when no position attends a padding key."""
    model = build_model(spec).eval()
    embedded: list[Tensor] = []

    def keep(module: torch.nn.Module, args: tuple, out: Tensor) -> None:
        out.retain_grad()
        embedded.append(out)

    hook = model.reformer.tokens.register_forward_hook(keep)
    try:
        batch_loss(model, batch)[0].backward()
    finally:
        hook.remove()
    padding = batch.input_ids == TOKEN_ID[PAD]
    assert padding.any(), "the batch needs padding to say anything"
    return float(embedded[0].grad[padding].abs().max())


def _listops_runs(settings: str, backends: list[str] | None = None) -> list[RunSpec]:
    runs, skipped = plan_runs(listops_preset("cpu", settings), backends=backends, seeds=[0])
    assert not skipped
    return runs


def test_the_trainer_masks_listops_padding_and_an_unmasked_task_does_not() -> None:
    (spec,) = _listops_runs(OWN_SETTINGS, ["full"])
    batch = spec.preset.task.sample(4, torch.Generator().manual_seed(0))
    assert _padding_gradient(spec, batch) == 0.0
    unmasked = dataclasses.replace(spec.preset.task, mask_padding=False)
    read = unmasked.sample(4, torch.Generator().manual_seed(0))
    assert torch.equal(read.input_ids, batch.input_ids) and read.attention_mask is None
    assert _padding_gradient(spec, read) > 1e-4  # the same model reads the padding unmasked


@pytest.mark.slow  # ~1 s per backend on 2 cores
@pytest.mark.parametrize("settings", [OWN_SETTINGS, LRA_SETTINGS])
def test_no_listops_backend_attends_padding(settings: str) -> None:
    for spec in _listops_runs(settings):
        batch = spec.preset.task.sample(4, torch.Generator().manual_seed(0))
        assert _padding_gradient(spec, batch) == 0.0, spec.variant.label


def test_scored_only_logits_give_the_full_logits_loss() -> None:
    task = AssociativeRecallTask(seq_len=32, vocab_size=64, num_kv_pairs=4, eval_size=8)
    batch = task.build(seed=0).eval_set
    config = ReformerConfig(
        attn_layers=["full"],
        num_hidden_layers=1,
        hidden_size=32,
        num_attention_heads=2,
        feed_forward_size=32,
        vocab_size=64,
        max_position_embeddings=32,
        axial_pos_embds=False,
        is_decoder=True,
    )
    torch.manual_seed(0)
    model = ReformerLM(config).eval()
    full = scored_loss(logits_of(model(batch.input_ids)), batch.labels)
    head_rows: list[int] = []
    hook = model.lm_head.register_forward_hook(lambda m, args, out: head_rows.append(len(out)))
    try:
        scored = batch_loss(model, batch)
    finally:
        hook.remove()
    assert torch.allclose(full[0], scored[0], atol=1e-6)
    assert full[1:] == scored[1:] and int(scored[2]) == 8 * 4
    assert head_rows == [8 * 4]  # the output layer saw the scored positions only, not 8 x 31
