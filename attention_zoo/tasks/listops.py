"""ListOps of the Long Range Arena (Nangia & Bowman 2018; Tay et al. 2021, LRA's `listops.py`).

Nested lists of MIN, MAX, MED (median, rounded down) and SM (sum modulo 10) over digits 0-9, such
as `[MAX 2 9 [MIN 4 7 ] 0 ]` = 9; the model reads the whole expression (bidirectional) and outputs
its value, one of 10 classes. Trees are drawn as LRA draws them (an operator with probability 0.25
below the maximal depth, 2..max_args arguments) and kept when min_length < tokens < max_length.
"""

from __future__ import annotations

import functools
import random
from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ..errors import ConfigError
from .base import Batch, TaskConfig, register_task

# LRA's operator tokens (with their opening bracket), the closing bracket and the digits.
OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
CLOSE = "]"
DIGITS = tuple(str(d) for d in range(10))
PAD, CLS = "<pad>", "<cls>"  # padding to seq_len; the first token, read by the pooled head
VOCAB = (PAD, CLS, *DIGITS, *OPERATORS, CLOSE)
TOKEN_ID = {token: i for i, token in enumerate(VOCAB)}
OPERATOR_P = 0.25  # LRA's VALUE_P: a node above the maximal depth is an operator this often


class _TooLong(Exception):
    """A tree under construction reached max_length: it will be rejected, stop drawing it."""


def _apply(op: str, args: list[int]) -> int:
    if op == "[MIN":
        return min(args)
    if op == "[MAX":
        return max(args)
    if op == "[SM":
        return sum(args) % 10
    ordered = sorted(args)  # "[MED": the median, the mean of the middle two rounded down
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) // 2


def draw_tree(
    rng: random.Random, max_depth: int, max_args: int, max_length: int
) -> tuple[list[str], int]:
    """One LRA tree as tokens and its value; raises _TooLong once it reaches max_length tokens."""
    tokens: list[str] = []

    def node(depth: int) -> int:
        if depth < max_depth and rng.random() <= OPERATOR_P:
            op = rng.choice(OPERATORS)
            tokens.append(op)
            args = [node(depth + 1) for _ in range(rng.randint(2, max_args))]
            tokens.append(CLOSE)
            if len(tokens) >= max_length:
                raise _TooLong
            return _apply(op, args)
        value = rng.randrange(10)
        tokens.append(DIGITS[value])
        if len(tokens) >= max_length:
            raise _TooLong
        return value

    value = node(1)
    return tokens, value


@functools.cache
def expression_lengths(max_depth: int, max_args: int, max_length: int) -> frozenset[int]:
    """Every token count below max_length that a tree of `draw_tree` can have (bit n of each
    mask: a subtree of n tokens is possible)."""
    below = (1 << max_length) - 1
    lengths = 1 << 1  # a digit, at the maximal depth or drawn above it
    for _ in range(max_depth - 1):
        sizes = [n for n in range(max_length) if lengths >> n & 1]
        sums, operators = lengths, 0  # sums: token counts of j subtrees, from j = 1
        for _ in range(2, max_args + 1):
            more = 0
            for n in sizes:
                more |= sums << n
            sums = more & below
            operators |= sums
        lengths = (1 << 1 | operators << 2) & below  # a digit, or `[OP` subtrees `]`
    return frozenset(n for n in range(max_length) if lengths >> n & 1)


@register_task("listops")
@dataclass(frozen=True, kw_only=True)
class ListOpsTask(TaskConfig):
    """LRA ListOps: the value (0-9) of a nested MIN/MAX/MED/SM expression, read bidirectionally."""

    num_classes: ClassVar[int | None] = 10
    seq_len: int = 2000  # model input: <cls> + the expression, padded with <pad>
    vocab_size: int = len(VOCAB)
    min_length: int = 500  # LRA: expressions have more than min_length tokens ...
    max_length: int = 2000  # ... and fewer than max_length
    max_depth: int = 10  # nesting depth of the tree (the root is depth 1)
    max_args: int = 10  # arguments per operator, at least 2
    mask_padding: bool = True  # padding is masked as keys (as LRA masks it); False: it is read

    def __post_init__(self) -> None:
        super().__post_init__()
        problems = []
        if self.vocab_size != len(VOCAB):
            problems.append(
                f"vocab_size must be {len(VOCAB)} (ListOps' tokens), got {self.vocab_size}"
            )
        if not 1 <= self.min_length < self.max_length - 1:
            problems.append(
                f"need 1 <= min_length < max_length - 1, got {self.min_length}, {self.max_length}"
            )
        if self.seq_len < self.max_length:
            problems.append(
                f"seq_len {self.seq_len} must be >= max_length {self.max_length} "
                "(<cls> + up to max_length - 1 tokens)"
            )
        if self.max_depth < 2 or self.max_args < 2:
            problems.append(
                f"max_depth and max_args must be >= 2, got {self.max_depth}, {self.max_args}"
            )
        elif self.max_length > 2 and self.min_length >= (
            longest := max(expression_lengths(self.max_depth, self.max_args, self.max_length))
        ):
            problems.append(
                f"no expression has more than min_length {self.min_length} and fewer than "
                f"max_length {self.max_length} tokens: at max_depth {self.max_depth} and max_args "
                f"{self.max_args} the longest below max_length has {longest}; lower min_length "
                "or raise max_length, max_depth or max_args"
            )
        if problems:
            raise ConfigError("listops: " + "; ".join(problems))

    def draw(self, rng: random.Random) -> tuple[list[str], int]:
        """One expression (tokens) and its value, drawn until it has an accepted length."""
        while True:
            try:
                tokens, value = draw_tree(rng, self.max_depth, self.max_args, self.max_length)
            except _TooLong:
                continue
            if len(tokens) > self.min_length:
                return tokens, value

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        # the trees are drawn by Python's RNG, seeded from the stream: the batch stays reproducible
        rng = random.Random(int(torch.randint(0, 2**62, (1,), generator=generator)))
        input_ids = torch.full((batch_size, self.seq_len), TOKEN_ID[PAD], dtype=torch.long)
        labels = torch.empty(batch_size, dtype=torch.long)
        for i in range(batch_size):
            tokens, labels[i] = self.draw(rng)
            ids = [TOKEN_ID[CLS], *(TOKEN_ID[t] for t in tokens)]
            input_ids[i, : len(ids)] = torch.tensor(ids)
        mask = input_ids != TOKEN_ID[PAD] if self.mask_padding else None
        return Batch(input_ids, labels, mask)

    def chance_accuracy(self) -> float:
        return 1.0 / 10

    def baseline_accuracy(self) -> float:
        """The root-operator rule: for each root operator its most common value (what a model
        scores without evaluating the expression), over BASELINE_DRAWS expressions."""
        return _root_operator_accuracy(self)

    def examples(self, batch: Batch) -> list[dict[str, Any]]:
        """Each expression as LRA writes it (space-separated tokens) and its value."""
        skip = {TOKEN_ID[PAD], TOKEN_ID[CLS]}
        return [
            {"input": " ".join(VOCAB[t] for t in row.tolist() if t not in skip), "target": int(y)}
            for row, y in zip(batch.input_ids, batch.labels)
        ]


BASELINE_DRAWS = 4000  # expressions the root-operator rule is fitted and scored on (s.e. < 1 point)


@functools.cache
def _root_operator_accuracy(task: ListOpsTask) -> float:
    rng = random.Random(0)
    tally: dict[str, Counter[int]] = {}
    for _ in range(BASELINE_DRAWS):
        tokens, value = task.draw(rng)
        tally.setdefault(tokens[0], Counter())[value] += 1
    return sum(c.most_common(1)[0][1] for c in tally.values()) / BASELINE_DRAWS
