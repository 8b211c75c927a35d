"""ListOps generator: values checked by an independent parser; LRA's length, depth, arity limits."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import torch

from attention_zoo.errors import ConfigError
from attention_zoo.tasks.listops import ListOpsTask

FUNCTIONS = {
    "[MIN": min,
    "[MAX": max,
    "[MED": lambda xs: int(statistics.median(xs)),  # LRA: int(np.median(...)); values >= 0
    "[SM": lambda xs: sum(xs) % 10,
}


def evaluate(text: str) -> tuple[int, int, int]:
    """(value, depth, most arguments of one operator) of a space-separated ListOps expression."""
    tokens = text.split()
    pos = 0

    def node() -> tuple[int, int, int]:
        nonlocal pos
        token = tokens[pos]
        pos += 1
        if token.isdigit():
            return int(token), 1, 0
        args, depth, widest = [], 0, 0
        while tokens[pos] != "]":
            value, d, w = node()
            args.append(value)
            depth, widest = max(depth, d), max(widest, w)
        pos += 1
        return FUNCTIONS[token](args), depth + 1, max(widest, len(args))

    result = node()
    assert pos == len(tokens), "trailing tokens after the expression"
    return result


def test_independent_parser_on_a_known_expression() -> None:
    assert evaluate("[MAX 2 9 [MIN 4 7 ] 0 ]") == (
        9,
        3,
        4,
    )  # depth counts the digits as a level (LRA: root at 1)
    assert evaluate("[MED 1 2 [SM 9 9 ] 5 ]") == (3, 3, 4)  # median of 1 2 8 5 = 3.5 -> 3


@pytest.mark.slow
@pytest.mark.parametrize(
    "fields",
    [
        dict(seq_len=64, min_length=8, max_length=64, max_depth=4, max_args=5),
        dict(seq_len=200, min_length=60, max_length=200),
    ],
)
def test_values_and_limits_agree_with_an_independent_evaluator(fields: dict) -> None:
    task = ListOpsTask(**fields)
    examples = list(task.first_examples(seed=0, n=200))
    for example in examples:
        value, depth, widest = evaluate(example["input"])
        assert example["target"] == value, example
        n = len(example["input"].split())
        assert task.min_length < n < task.max_length
        assert depth <= task.max_depth and 2 <= widest <= task.max_args
    targets = [e["target"] for e in examples]
    assert set(targets) == set(range(10))  # every class occurs
    assert max(targets.count(c) for c in range(10)) < 0.4 * len(targets)  # no class dominates


def test_paper_scale_batch_lengths_and_token_layout() -> None:
    task = ListOpsTask()  # LRA: 500 < tokens < 2000, depth <= 10, <= 10 arguments
    batch = task.sample(4, torch.Generator().manual_seed(1))
    assert batch.input_ids.shape == (4, 2000) and batch.labels.shape == (4,)
    assert (batch.input_ids[:, 0] == 1).all()  # <cls> first, read by the pooled head
    for example in task.examples(batch):
        assert 500 < len(example["input"].split()) < 2000
        assert evaluate(example["input"])[0] == example["target"]


@pytest.mark.slow
def test_same_seed_same_examples_and_a_stream() -> None:
    task = ListOpsTask(seq_len=64, min_length=8, max_length=64, max_depth=4)
    assert list(task.first_examples(3, 5)) == list(task.first_examples(3, 5))
    assert list(task.first_examples(3, 5)) != list(task.first_examples(4, 5))
    data = task.build(0)
    first, second = next(data.batches(8)), next(data.batches(8))
    assert not torch.equal(first.input_ids, second.input_ids)  # fresh batches, never a fixed set


def test_bad_config_names_every_problem() -> None:
    with pytest.raises(
        ConfigError, match=r"vocab_size must be 17.*seq_len 100 must be >= max_length"
    ):
        ListOpsTask(seq_len=100, vocab_size=20, min_length=10, max_length=200)


@pytest.mark.slow  # trains the smoke preset and measures each model's training step
@pytest.mark.long
def test_the_report_s_accuracy_x_cost_covers_listops(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A classification task's runs and their training-step cost (measured as the sequence
    classifier) meet in the report's Accuracy x cost section like any other task's."""
    from attention_zoo.cli import main

    store = str(tmp_path / "zoo.sqlite")
    argv = ["task", "listops", "--preset", "smoke", "--cost", "--store", store, "--quiet"]
    assert main([*argv, "--threads", "1"]) == 0
    assert main(["report", "--store", store, "--out", str(tmp_path / "report")]) == 0
    capsys.readouterr()
    text = (tmp_path / "report" / "report.md").read_text()
    section = text.split("## Accuracy x cost")[1].split("\n## ")[0]
    assert "No task run has a cost row" not in section
    assert "listops" in section and "full" in section
