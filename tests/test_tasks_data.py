"""Task data generators: shapes, structure, scored positions, seeding."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from attention_zoo.errors import ConfigError, OptionError, UnknownNameError
from attention_zoo.tasks.associative_recall import AssociativeRecallTask
from attention_zoo.tasks.base import TASKS, make_task, stream_seed
from attention_zoo.tasks.duplication import DuplicationTask
from attention_zoo.tasks.listops import TOKEN_ID, ListOpsTask, draw_tree, expression_lengths


def test_duplication_structure_and_scored_positions() -> None:
    task = DuplicationTask(seq_len=16, vocab_size=5, eval_size=64)
    batch = task.build(seed=3).eval_set
    ids, labels = batch.input_ids, batch.labels
    assert ids.shape == labels.shape == (64, 16) and ids.dtype == torch.long
    half = 8
    assert (ids[:, 0] == 0).all() and (ids[:, half] == 0).all()
    w = ids[:, 1:half]
    assert ((w >= 1) & (w <= 4)).all()  # symbols 1..V-1, never the separator
    assert torch.equal(ids[:, half + 1 :], w)  # the second copy repeats the first
    scored = batch.scored()
    expected = torch.zeros(16, dtype=torch.bool)
    expected[half + 1 :] = True  # exactly the second copy
    assert torch.equal(scored, expected.expand(64, 16))
    assert torch.equal(labels[scored], ids[scored])
    assert set(w.unique().tolist()) == {1, 2, 3, 4}  # uniform over all symbols (64*7 draws)


def test_duplication_symbols_are_uniform() -> None:
    w = (
        DuplicationTask(seq_len=64, vocab_size=9, eval_size=2000)
        .build(0)
        .eval_set.input_ids[:, 1:32]
    )
    counts = torch.bincount(w.flatten(), minlength=9)[1:].double()
    expected = w.numel() / 8
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 30, chi2  # 7 dof: p ~ 1e-4


def test_same_seed_same_data_different_seed_different_data() -> None:
    task = DuplicationTask(seq_len=32, vocab_size=7, eval_size=8)
    a, b, c = task.build(1), task.build(1), task.build(2)
    assert torch.equal(a.eval_set.input_ids, b.eval_set.input_ids)
    assert not torch.equal(a.eval_set.input_ids, c.eval_set.input_ids)
    ta, tb = a.batches(4), b.batches(4)
    first_a, first_b = next(ta), next(tb)
    assert torch.equal(first_a.input_ids, first_b.input_ids)
    assert not torch.equal(first_a.input_ids, next(ta).input_ids)  # fresh batch every step
    # Train stream and eval set are separate streams of the same seed.
    assert not torch.equal(first_a.input_ids, a.eval_set.input_ids[:4])
    # The eval set does not depend on how many sequences it holds beyond its prefix's draws,
    # and the training stream not on the eval set size.
    bigger = DuplicationTask(seq_len=32, vocab_size=7, eval_size=16).build(1)
    assert torch.equal(next(bigger.batches(4)).input_ids, first_a.input_ids)


def test_associative_recall_structure() -> None:
    task = AssociativeRecallTask(seq_len=64, vocab_size=64, num_kv_pairs=8, eval_size=200)
    batch = task.build(seed=0).eval_set
    ids, labels = batch.input_ids, batch.labels
    assert ids.shape == labels.shape == (200, 64)
    keys, values = ids[:, 0:16:2], ids[:, 1:16:2]
    assert ((keys >= 1) & (keys < 32)).all() and ((values >= 32) & (values < 64)).all()
    assert all(len(set(row.tolist())) == 8 for row in keys)  # keys unique per sequence
    scored = batch.scored()
    assert (scored.sum(1) == 8).all()  # one query per key
    assert not scored[:, :17].any()  # nothing scored inside the key-value context
    for i in range(200):
        pairs = dict(zip(keys[i].tolist(), values[i].tolist()))
        positions = scored[i].nonzero().flatten()
        queried = ids[i, positions - 1].tolist()  # the query key just before a scored position
        assert sorted(queried) == sorted(pairs)  # every key queried exactly once
        assert labels[i, positions].tolist() == [pairs[k] for k in queried]
        assert ((positions - 1 - 16) % 2 == 0).all()  # query keys at even offsets


def test_associative_recall_zero_filler_and_seeding() -> None:
    task = AssociativeRecallTask(
        seq_len=32, vocab_size=32, num_kv_pairs=4, eval_size=16, random_non_queries=False
    )
    a = task.build(5).eval_set
    assert torch.equal(a.input_ids, task.build(5).eval_set.input_ids)
    query_region = a.input_ids[:, 8:]
    assert ((query_region == 0).sum(1) == 24 - 4).all()  # only the 4 query keys are non-zero


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"seq_len": 15, "vocab_size": 8}, "even seq_len"),
        ({"seq_len": 16, "vocab_size": 2}, "vocab_size >= 3"),
    ],
)
def test_duplication_bad_config(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        DuplicationTask(**fields)


def test_associative_recall_bad_config_names_every_problem() -> None:
    with pytest.raises(ConfigError) as err:
        AssociativeRecallTask(seq_len=30, vocab_size=8, num_kv_pairs=8)
    text = str(err.value)
    assert "4 * num_kv_pairs" in text and "unique keys" in text


def test_task_registry_and_make_task_errors() -> None:
    assert {"duplication", "associative-recall"} <= set(TASKS.names())
    with pytest.raises(UnknownNameError, match=r"known tasks: .*associative-recall.*duplication"):
        make_task("copy-paste")
    with pytest.raises(OptionError, match=r"does not take field.*'seq_length'.*it takes: seq_len"):
        make_task("duplication", seq_length=8)
    task = make_task("duplication", seq_len=8, vocab_size=4)
    assert task.to_dict()["task"] == "duplication" and task.chance_accuracy() == pytest.approx(
        1 / 3
    )
    with pytest.raises(ConfigError):
        make_task("duplication", seq_len=9, vocab_size=4)


def test_mqar_query_gaps_follow_zoologys_power_law() -> None:
    """One pair: the query's gap g (in key-value slots after the context) has Zoology's
    p(g) ~ a (g + 1)^(a - 1), g = 0 .. slots - 1 (multiquery_ar.py), checked by chi-square."""
    task = AssociativeRecallTask(seq_len=18, vocab_size=32, num_kv_pairs=1, power_a=0.3)
    batch = task.sample(4000, torch.Generator().manual_seed(0))
    query_at = batch.scored().float().argmax(1) - 1  # the query key sits before its scored value
    gaps = (query_at - 2) // 2
    slots = 8
    counts = torch.bincount(gaps, minlength=slots).double()
    p = torch.arange(1, slots + 1, dtype=torch.float64) ** (0.3 - 1)
    expected = 4000 * p / p.sum()
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert counts[0] > 2 * counts[-1] and chi2 < 25, (counts, expected)  # 7 dof: p ~ 1e-3


def test_training_stream_never_yields_an_evaluation_sequence() -> None:
    # L 8, V 12, 1 pair: 90 distinct sequences, so the stream would repeat evaluation ones
    task = AssociativeRecallTask(seq_len=8, vocab_size=12, num_kv_pairs=1, eval_size=16,
                                 random_non_queries=False)  # fmt: skip
    data = task.build(seed=0)
    held_out = {tuple(row.tolist()) for row in data.eval_set.input_ids}
    batches = data.batches(32)
    drawn = [tuple(row.tolist()) for _ in range(5) for row in next(batches).input_ids]
    assert len(drawn) == 160 and not held_out & set(drawn)
    assert data.dropped > 0  # the stream did draw evaluation sequences, and replaced them


def test_the_test_set_is_held_out_of_the_evaluation_set_and_of_training() -> None:
    """The test set a run reports is drawn from its own stream, none of its sequences in the
    evaluation set (which stops training) or in the training stream; the evaluation set is the
    draw it always was."""
    task = AssociativeRecallTask(seq_len=8, vocab_size=12, num_kv_pairs=1, eval_size=16,
                                 random_non_queries=False)  # fmt: skip
    data = task.build(seed=0)
    evals = {tuple(row.tolist()) for row in data.eval_set.input_ids}
    tests = [tuple(row.tolist()) for row in data.test_set.input_ids]
    assert len(tests) == 16 and not evals & set(tests)
    batches = data.batches(32)
    drawn = {tuple(row.tolist()) for _ in range(5) for row in next(batches).input_ids}
    assert not (evals | set(tests)) & drawn
    assert torch.equal(task.build(seed=0).test_set.input_ids, data.test_set.input_ids)
    assert not torch.equal(task.build(seed=1).test_set.input_ids, data.test_set.input_ids)
    eval_stream = torch.Generator().manual_seed(stream_seed(0, 2))
    assert torch.equal(data.eval_set.input_ids, task.sample(16, eval_stream).input_ids)


def test_an_evaluation_set_holding_every_sequence_is_refused() -> None:
    """Parity over 4 tokens has 16 sequences; 512 evaluation draws hold them all, so no test or
    training sequence exists: a one-line ConfigError, not an endless redraw."""
    task = make_task("state-tracking", seq_len=4, vocab_size=2, group="parity", eval_size=512)
    with pytest.raises(ConfigError, match="lower eval_size"):
        task.build(seed=0)


def test_held_out_sets_taking_most_of_a_task_are_refused_when_built() -> None:
    """18 distinct sequences: 16 evaluation and 16 test draws take about 90% of what the task
    draws, so it is refused when built, in one line, not part way through training; 90 distinct
    sequences (about 35% held out) build."""
    tiny = AssociativeRecallTask(seq_len=8, vocab_size=6, num_kv_pairs=1, eval_size=16,
                                 random_non_queries=False)  # fmt: skip
    for seed in range(3):
        with pytest.raises(
            ConfigError, match=r"test sets are 9\d\.\d% of the sequences .*lower eval_size"
        ):
            tiny.build(seed)
    small = dataclasses.replace(tiny, vocab_size=12)
    assert all(len(small.build(seed).test_set) == 16 for seed in range(3))


def test_listops_refuses_lengths_no_expression_has() -> None:
    """The token counts a tree can have are exactly those drawn; a window (min_length,
    max_length) holding none of them is refused in one line instead of drawing forever."""
    rng = random.Random(0)
    for depth, args in ((2, 3), (3, 2)):
        drawn = {len(draw_tree(rng, depth, args, 1000)[0]) for _ in range(5000)}
        assert drawn == expression_lengths(depth, args, 1000)
    drawn = {len(draw_tree(rng, 3, 3, 1000)[0]) for _ in range(5000)}
    assert drawn <= expression_lengths(3, 3, 1000) and max(drawn) < 1000
    with pytest.raises(ConfigError, match="the longest below max_length has 12; lower min_length"):
        ListOpsTask(seq_len=64, min_length=12, max_length=64, max_depth=2, max_args=10)
    with pytest.raises(ConfigError, match="the longest below max_length has 7"):
        ListOpsTask(seq_len=16, min_length=7, max_length=10, max_depth=3, max_args=2)  # 1, 4, 7, 10
    assert ListOpsTask(seq_len=64, min_length=11, max_length=64, max_depth=2, max_args=10)


@pytest.mark.slow
def test_listops_masks_its_padding() -> None:
    task = ListOpsTask(seq_len=64, min_length=10, max_length=64, max_depth=4, max_args=5)
    batch = task.sample(8, torch.Generator().manual_seed(0))
    assert torch.equal(batch.attention_mask, batch.input_ids != TOKEN_ID["<pad>"])
    unmasked = ListOpsTask(seq_len=64, min_length=10, max_length=64, mask_padding=False)
    assert unmasked.sample(2, torch.Generator().manual_seed(0)).attention_mask is None
    assert 0.1 < task.baseline_accuracy() < 0.6  # the root-operator rule, from the generator
