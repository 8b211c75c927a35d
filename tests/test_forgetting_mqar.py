"""Forgetting-MQAR generator against Zoology's definition: a key bound twice answers with its
latest value, every key is asked once, and the first-binding rule scores the stated baseline."""

from __future__ import annotations

import re

import pytest
import torch

from attention_zoo.errors import ConfigError
from attention_zoo.model import IGNORE_INDEX
from attention_zoo.tasks.forgetting_mqar import ForgettingMQARTask


@pytest.mark.slow
def test_every_answer_is_the_latest_binding() -> None:
    task = ForgettingMQARTask(
        seq_len=48, vocab_size=64, num_kv_pairs=4, num_updates=2, random_non_queries=True
    )
    batch = task.sample(10_000, torch.Generator().manual_seed(0))
    context = 2 * (4 + 2)
    wrong, first_right, asked = 0, 0, 0
    for ids, labels in zip(batch.input_ids.tolist(), batch.labels.tolist()):
        latest, first = {}, {}
        for k, v in zip(ids[0:context:2], ids[1:context:2]):
            first.setdefault(k, v)
            latest[k] = v  # the latest binding wins
        queried = [ids[i - 1] for i, t in enumerate(labels) if t != IGNORE_INDEX]
        answers = [t for t in labels if t != IGNORE_INDEX]
        wrong += not (
            sorted(queried) == sorted(latest)  # each of the 4 keys asked once
            and len(latest) == 4
            and sum(first[k] != latest[k] for k in latest) == 2  # 2 rebound to a new value
            and answers == [latest[k] for k in queried]
            and labels[:context] == [IGNORE_INDEX] * context
        )
        first_right += sum(first[k] == a for k, a in zip(queried, answers))
        asked += len(answers)
    assert wrong == 0
    assert first_right / asked == task.baseline_accuracy() == 0.5
    assert task.chance_accuracy() == 1 / 32


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(num_updates=5), "num_updates must be in 0..num_kv_pairs = 4"),
        (dict(seq_len=18), "must be <= seq_len (context + queries), got 20 > 18"),
        (dict(seq_len=33), "forgetting-mqar: seq_len must be even"),
    ],
)
def test_bad_configs_say_what_would_work(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        ForgettingMQARTask(
            **{"seq_len": 48, "vocab_size": 64, "num_kv_pairs": 4, "num_updates": 2, **fields}
        )
