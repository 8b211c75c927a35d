"""State-tracking generator against its definition: every label is the product of the tokens before
it, computed here by an independent fold over permutation tuples; parity's label is the xor."""

from __future__ import annotations

import itertools
import re

import pytest
import torch

from attention_zoo.errors import ConfigError
from attention_zoo.model import IGNORE_INDEX
from attention_zoo.tasks.groups import group_elements
from attention_zoo.tasks.state_tracking import StateTrackingTask


def _is_even(p: tuple[int, ...]) -> bool:
    """By cycle count: a permutation of n items with c cycles has parity n - c."""
    seen, cycles = set(), 0
    for start in range(len(p)):
        if start not in seen:
            cycles += 1
            i = start
            while i not in seen:
                seen.add(i)
                i = p[i]
    return (len(p) - cycles) % 2 == 0


def _elements(kind: str, n: int) -> list[tuple[int, ...]]:
    perms = list(itertools.permutations(range(n)))  # lexicographic, as the task's tokens
    return perms if kind == "S" else [p for p in perms if _is_even(p)]


def _running_products(word: list[int], elements: list[tuple[int, ...]]) -> list[int]:
    """The index of g_1 · ... · g_t for t = 1..len(word); a · b applies a, then b."""
    index = {p: i for i, p in enumerate(elements)}
    state, out = tuple(range(len(elements[0]))), []
    for token in word:
        g = elements[token]
        state = tuple(g[state[i]] for i in range(len(state)))
        out.append(index[state])
    return out


def test_groups_have_their_orders_and_the_task_uses_the_lexicographic_elements() -> None:
    assert [len(group_elements(g)) for g in ("parity", "Z3", "S3", "A4", "S5", "A5")] == [
        2,
        3,
        6,
        12,
        120,
        60,
    ]
    assert list(group_elements("S5")) == _elements("S", 5)
    assert list(group_elements("A5")) == _elements("A", 5)
    assert group_elements("A5")[0] == tuple(range(5))  # the identity first


@pytest.mark.slow
@pytest.mark.parametrize("group, kind, n", [("S5", "S", 5), ("A5", "A", 5), ("S3", "S", 3)])
def test_every_label_is_the_composed_permutation_of_its_prefix(
    group: str, kind: str, n: int
) -> None:
    elements = _elements(kind, n)
    task = StateTrackingTask(seq_len=12, group=group, vocab_size=len(elements))
    batch = task.sample(10_000, torch.Generator().manual_seed(0))
    assert (batch.labels[:, 0] == IGNORE_INDEX).all()  # nothing read yet
    wrong = sum(
        _running_products(word[:-1], elements) != labels[1:]
        for word, labels in zip(batch.input_ids.tolist(), batch.labels.tolist())
    )
    assert wrong == 0


def test_parity_label_is_the_xor_of_the_prefix_and_tokens_are_uniform() -> None:
    task = StateTrackingTask(seq_len=40, group="parity", vocab_size=2)
    batch = task.sample(10_000, torch.Generator().manual_seed(1))
    bits = batch.input_ids
    xor = torch.cumsum(bits, dim=1) % 2  # independent of the task's scan
    assert torch.equal(batch.labels[:, 1:], xor[:, :-1])
    assert abs(bits.float().mean().item() - 0.5) < 0.01
    assert task.chance_accuracy() == 0.5


def test_splits_score_the_positions_past_the_previous_length() -> None:
    task = StateTrackingTask(
        seq_len=16, group="S3", vocab_size=6, test_lengths=(32, 64), split_size=8
    )
    assert task.max_positions() == 64 and task.chance_accuracy() == 1 / 6
    data = task.build(seed=0)
    assert list(data.splits) == ["pos16-31", "pos32-63"]
    assert data.eval_set.input_ids.shape == (task.eval_size, 16)
    for label, (length, first) in {"pos16-31": (32, 16), "pos32-63": (64, 32)}.items():
        split = data.splits[label]
        assert split.input_ids.shape == (8, length)
        scored = split.scored()
        assert not scored[:, :first].any() and scored[:, first:].all()
        elements = _elements("S", 3)
        for word, labels in zip(split.input_ids.tolist(), split.labels.tolist()):
            assert _running_products(word[:-1], elements)[first - 1 :] == labels[first:]


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(group="S7", vocab_size=2), "out of range"),
        (dict(group="Q8", vocab_size=2), "unknown group 'Q8'"),
        (dict(group="S5", vocab_size=2), "vocab_size must be the order of S5, 120"),
        (dict(test_lengths=(64, 32)), "test_lengths must increase"),
        (dict(test_lengths=(8,)), "test_lengths must increase"),
        (dict(score_from=16), "score_from must be in 1..seq_len - 1"),
    ],
)
def test_bad_configs_say_what_would_work(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        StateTrackingTask(**{"seq_len": 16, **fields})
