"""Selective-copying generator against the Mamba paper's definition: the scored targets are the
data tokens in the order they appear, the copy token comes once, after all of them."""

from __future__ import annotations

import re

import pytest
import torch

from attention_zoo.errors import ConfigError
from attention_zoo.model import IGNORE_INDEX
from attention_zoo.tasks.selective_copying import BLANK, SelectiveCopyingTask


def test_targets_are_the_marked_tokens_in_order() -> None:
    task = SelectiveCopyingTask(seq_len=48, vocab_size=16, num_tokens=6)
    batch = task.sample(10_000, torch.Generator().manual_seed(0))
    copy = task.copy_token
    wrong = 0
    for ids, labels in zip(batch.input_ids.tolist(), batch.labels.tolist()):
        at = ids.index(copy)
        data = [t for t in ids[:at] if t != BLANK]
        scored = [t for t in labels if t != IGNORE_INDEX]
        wrong += not (
            ids.count(copy) == 1
            and len(data) == 6
            and all(t == BLANK for t in ids[at + 1 :])
            and labels[: at + 1] == [IGNORE_INDEX] * (at + 1)
            and scored == data
            and labels[at + 1 :] == data  # one per position right after the copy token
        )
    assert wrong == 0


def test_data_tokens_and_their_positions_are_uniform() -> None:
    task = SelectiveCopyingTask(seq_len=64, vocab_size=10, num_tokens=4)
    batch = task.sample(4000, torch.Generator().manual_seed(1))
    region = batch.input_ids[:, : 64 - 4 - 1]
    data = region[region != BLANK]
    assert set(data.tolist()) == set(range(1, 9)) and task.chance_accuracy() == 1 / 8
    # every position of the region holds a data token equally often: 4 of 59 positions
    share = (region != BLANK).float().mean(0)
    assert (share - 4 / 59).abs().max() < 0.03


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(num_tokens=0), "num_tokens >= 1"),
        (dict(vocab_size=2), "vocab_size >= 3"),
        (dict(seq_len=16, num_tokens=8), "seq_len >= 2 * num_tokens + 1"),
    ],
)
def test_bad_configs_say_what_would_work(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        SelectiveCopyingTask(**{"seq_len": 64, "vocab_size": 16, "num_tokens": 4, **fields})
