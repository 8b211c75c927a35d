"""Needle-in-a-haystack generator against RULER's definitions, checked by an independent parser:
the asked values are exactly the needles' values of the asked key, in reading order, found at the
stated depth; distractors never carry an asked key; chance is 1 / num_values."""

from __future__ import annotations

import re

import pytest
import torch

from attention_zoo.errors import ConfigError
from attention_zoo.model import IGNORE_INDEX
from attention_zoo.tasks.niah import ANSWER, NEEDLE, PAD, QUERY, NeedleTask

SMALL = dict(seq_len=48, vocab_size=64, num_keys=16, num_values=24, eval_size=4, split_size=4)


def parse(ids: list[int], labels: list[int]) -> dict:
    """Needles (position, key, value) before the first QUERY, the query blocks (key, scored
    values, what their slots hold), the filler tokens before each needle, and the sequence's
    length without padding."""
    length = len(ids)
    while ids[length - 1] == PAD:  # PAD only pads the end
        length -= 1
    first_query = ids.index(QUERY)
    needles, filler, i = [], 0, 0
    fillers_before = []
    while i < first_query:
        if ids[i] == NEEDLE:
            needles.append((i, ids[i + 1], ids[i + 2]))
            fillers_before.append(filler)
            i += 3
        else:
            filler, i = filler + 1, i + 1
    queries, i = [], first_query
    while i < length:
        assert ids[i] == QUERY and labels[i] == labels[i + 1] == IGNORE_INDEX
        j = i + 2
        while j < length and ids[j] != QUERY:
            assert labels[j] != IGNORE_INDEX  # an answer's slot, scored
            j += 1
        queries.append((ids[i + 1], labels[i + 2 : j], ids[i + 2 : j]))
        i = j
    scored = [t for t in labels if t != IGNORE_INDEX]
    return dict(
        needles=needles,
        fillers=filler,
        fillers_before=fillers_before,
        queries=queries,
        length=length,
        scored=scored,
    )


def check(task: NeedleTask, ids: list[int], labels: list[int]) -> dict:
    """Assert one sequence follows the task's definition; return its parse."""
    p = parse(ids, labels)
    assert p["length"] in task.lengths
    ranges = task.token_ranges()
    v = task.values_per_key
    asked = [k for k, _, _ in p["queries"]]
    assert len(asked) == task.queries == len(set(asked))
    for key, answer, slots in p["queries"]:
        assert key in ranges["keys"] and all(a in ranges["values"] for a in answer)
        assert answer == [val for _, k, val in p["needles"] if k == key]  # reading order
        assert len(answer) == v
        assert slots == (answer if task.answers == "shown" else [ANSWER] * v)
    assert sorted(p["scored"]) == sorted(a for _, ans, _ in p["queries"] for a in ans)
    if task.haystack != "needle":  # every needle is a real one: k keys x v values
        keys = [k for _, k, _ in p["needles"]]
        assert len(keys) == task.needles and len(set(keys)) == task.keys_per_sequence
        assert set(asked) <= set(keys)
        assert p["fillers"] == task.haystack_units(p["length"])
    else:  # the haystack's needles carry keys no real needle has: each asked key v times
        for key in asked:
            assert sum(k == key for _, k, _ in p["needles"]) == v
    return p


@pytest.mark.slow
@pytest.mark.parametrize("answers", ["hidden", "shown"])
@pytest.mark.parametrize("variant", ["single", "multikey", "multivalue", "multiquery"])
@pytest.mark.parametrize("haystack", ["noise", "essay", "needle"])
def test_every_variant_and_haystack_follows_its_definition(
    variant: str, haystack: str, answers: str
) -> None:
    task = NeedleTask(
        **SMALL,
        lengths=(32, 48),
        variant=variant,
        haystack=haystack,
        num_needles=3,
        answers=answers,
    )
    batch = task.sample(10_000, torch.Generator().manual_seed(0))
    for ids, labels in zip(batch.input_ids.tolist(), batch.labels.tolist()):
        check(task, ids, labels)
    rows = zip(batch.input_ids.tolist()[:50], batch.labels.tolist()[:50])
    assert {parse(ids, labels)["length"] for ids, labels in rows} == {32, 48}  # both rungs


@pytest.mark.slow
def test_ten_thousand_single_needles_are_recoverable_at_their_depth() -> None:
    task = NeedleTask(**SMALL, lengths=(48,), haystack="essay", depth=0.5)
    batch = task.sample(10_000, torch.Generator().manual_seed(1))
    units = task.haystack_units(48)
    for ids, labels in zip(batch.input_ids.tolist(), batch.labels.tolist()):
        p = check(task, ids, labels)
        ((at, key, value),) = p["needles"]
        assert p["fillers_before"] == [round(0.5 * units)] and at == round(0.5 * units)
        assert p["queries"] == [(key, [value], [ANSWER])]


@pytest.mark.parametrize("variant", ["single", "multikey", "multivalue", "multiquery"])
def test_depth_splits_put_the_asked_needles_at_their_depth(variant: str) -> None:
    task = NeedleTask(
        **SMALL, lengths=(32, 48), depths=(0.0, 0.5, 1.0), variant=variant, num_needles=3
    )
    data = task.build(seed=0)
    assert list(data.splits) == [f"n{n}-d{d}" for n in (32, 48) for d in (0, 50, 100)]
    for label, split in data.splits.items():
        length, depth = int(label[1:3]), int(label.split("-d")[1]) / 100
        assert split.input_ids.shape == (task.split_size, length)
        units = task.haystack_units(length)
        for ids, labels in zip(split.input_ids.tolist(), split.labels.tolist()):
            p = check(task, ids, labels)
            asked = {k for k, _, _ in p["queries"]}
            at = [f for (_, k, _), f in zip(p["needles"], p["fillers_before"]) if k in asked]
            assert at == [round(depth * units)] * len(at), (label, p)


def test_chance_is_one_over_the_values_and_the_answers_are_uniform() -> None:
    task = NeedleTask(**SMALL, variant="multiquery", num_needles=3)
    assert task.chance_accuracy() == 1 / 24
    labels = task.sample(4000, torch.Generator().manual_seed(2)).labels
    answers = labels[labels != IGNORE_INDEX] - task.token_ranges()["values"][0]
    counts = torch.bincount(answers, minlength=24).double()
    expected = answers.numel() / 24
    assert float(((counts - expected) ** 2 / expected).sum()) < 60  # 23 dof: p ~ 1e-4


@pytest.mark.parametrize(
    ("variant", "haystack", "answers", "low", "high"),
    [
        ("single", "essay", "hidden", 1.0, 1.0),  # the one needle's value: the only value
        ("multivalue", "essay", "shown", 1.0, 1.0),  # its values, asked in reading order
        # hidden: the first value is right for the first answer only (and where values repeat)
        ("multivalue", "essay", "hidden", 0.33, 0.42),
        # one of 3 needles, but the asked one reads first a little more often than 1/3 (needles
        # at one insertion point keep their order, the asked one first) and values repeat
        ("multikey", "essay", "hidden", 0.33, 0.42),
        ("multiquery", "essay", "shown", 0.60, 0.66),  # answers given: H_3 / 3 = 0.61
        ("multiquery", "essay", "hidden", 0.33, 0.42),  # nothing ruled out: about 1/3
        ("multiquery", "needle", "shown", 0.0, 0.25),  # distractors' values are candidates too
    ],
)
def test_key_blind_rules_score_what_the_generator_allows(
    variant, haystack, answers, low, high
) -> None:
    """The baseline: the best of three rules that never read the asked key."""
    task = NeedleTask(**SMALL, variant=variant, haystack=haystack, num_needles=3, answers=answers)
    assert low <= task.baseline_accuracy() <= high


def test_noise_haystack_is_one_repeated_pattern() -> None:
    task = NeedleTask(**SMALL, haystack="noise")
    batch = task.sample(2, torch.Generator().manual_seed(3))
    filler = task.token_ranges()["filler"]
    for row in batch.input_ids.tolist():
        tokens = [t for t in row if t in filler]
        assert tokens == [filler[i % len(filler)] for i in range(len(tokens))]


def test_padding_after_the_last_answer_is_never_scored() -> None:
    task = NeedleTask(**SMALL, lengths=(32, 48))
    batch = task.sample(64, torch.Generator().manual_seed(4))
    short = (batch.input_ids[:, 32:] == PAD).all(1)
    assert short.any() and (~short).any()
    assert (batch.labels[short, 32:] == IGNORE_INDEX).all()
    assert task.max_positions() == 48


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(variant="multi"), "variant must be one of single, multikey"),
        (dict(haystack="essays"), "haystack must be one of noise, essay, needle"),
        (dict(vocab_size=40), "vocab_size must be > 4 + num_keys + num_values = 44"),
        (dict(answers="given"), "answers must be one of hidden, shown"),
        (dict(lengths=(64,)), "lengths must increase up to seq_len 48"),
        (dict(lengths=(4, 48)), "lengths must be >= 7"),
        (dict(depths=(1.5,)), "depths must be in 0..1"),
        (dict(depths=(0.5, 0.501)), "depths must differ in whole percents"),
        (dict(variant="multikey", num_needles=1), "num_needles must be >= 2"),
        (dict(variant="multikey", num_needles=20), "need num_keys >= 20"),
    ],
)
def test_bad_configs_say_what_would_work(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        NeedleTask(**{**SMALL, **fields})
