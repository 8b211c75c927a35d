"""State tracking: the running product of a word over a finite group, predicted at every position.

The word problem of Merrill, Petty & Sabharwal 2024 ("The Illusion of State in State-Space
Models"; data format of jopetty/word-problem: tokens are element indices of the group, the target
their product) and the length generalisation test of Grazzi et al. 2025 ("Unlocking State-Tracking
in Linear RNNs Through Negative Eigenvalues", adankow/unlocking_state_tracking: train short, test
long). Tokens are drawn uniformly; labels[:, t] is the product of the first t tokens (groups.py),
so parity's label is the xor of the prefix. Trained at seq_len; each evaluation split scores the
positions from the previous length up to a longer one.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import torch

from ..errors import ConfigError
from .base import IGNORE_INDEX, Batch, TaskConfig, register_task
from .groups import group_elements, multiplication_table, prefix_products
from .tabulate import SplitMatrix


@register_task("state-tracking")
@dataclass(frozen=True, kw_only=True)
class StateTrackingTask(TaskConfig):
    """The prefix products of a uniform random word over `group`, scored at every position."""

    tabulation = SplitMatrix()
    seq_len: int = 64  # training length: prefixes of 1 .. seq_len - 1 tokens are scored
    vocab_size: int = 2  # the group's order: one token per element
    group: str = "parity"  # parity (= Z2), Z<n>, S<n> or A<n> (n <= 6); Grazzi et al.: parity, S5
    test_lengths: tuple[int, ...] = ()  # longer lengths, increasing: one evaluation split each
    score_from: int = 1  # first scored position (the prefix of this many tokens)
    split_size: int = 256  # sequences in each evaluation split

    def __post_init__(self) -> None:
        object.__setattr__(self, "test_lengths", tuple(self.test_lengths))
        super().__post_init__()
        order = len(group_elements(self.group))  # an unknown group raises, naming the known ones
        problems = []
        if self.vocab_size != order:
            problems.append(
                f"vocab_size must be the order of {self.group}, {order}, got {self.vocab_size}"
            )
        lengths = (self.seq_len, *self.test_lengths)
        if any(b <= a for a, b in itertools.pairwise(lengths)):
            problems.append(
                f"test_lengths must increase from seq_len {self.seq_len}, got {self.test_lengths}"
            )
        if not 1 <= self.score_from < self.seq_len:
            problems.append(
                f"score_from must be in 1..seq_len - 1 = {self.seq_len - 1}, got {self.score_from}"
            )
        if self.split_size < 1:
            problems.append(f"split_size must be >= 1, got {self.split_size}")
        if problems:
            raise ConfigError("state-tracking: " + "; ".join(problems))

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        table = multiplication_table(self.group)
        tokens = torch.randint(0, len(table), (batch_size, self.seq_len), generator=generator)
        labels = torch.full_like(tokens, IGNORE_INDEX)
        # labels[:, t] is predicted having read tokens[:, :t]: the product of those t tokens
        labels[:, 1:] = prefix_products(tokens[:, :-1], table)
        labels[:, : self.score_from] = IGNORE_INDEX
        return Batch(tokens, labels)

    def eval_splits(self) -> dict[str, TaskConfig]:
        """One split per test length: positions from the previous length to this one - 1."""
        splits: dict[str, TaskConfig] = {}
        start = self.seq_len
        for length in self.test_lengths:
            splits[f"pos{start}-{length - 1}"] = dataclasses.replace(
                self, seq_len=length, score_from=start, test_lengths=(), eval_size=self.split_size
            )
            start = length
        return splits

    def chance_accuracy(self) -> float:
        # a prefix product of uniform elements is itself uniform over the group
        return 1.0 / self.vocab_size
