"""Multi-query associative recall (MQAR), as in Zoology (Arora, Eyuboglu et al. 2023).

A context of `num_kv_pairs` key-value pairs (keys unique, from the lower half of the vocabulary;
values from the upper half), then a query region where each key appears once more at a random
even offset (gaps drawn from Zoology's power law); at the token after a query key the model must
produce its value. Everything else in the query region is random filler and unscored. Solving it
needs content-based lookup of the previous occurrence, i.e. an induction circuit of >= 2 layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..errors import ConfigError
from .base import IGNORE_INDEX, Batch, TaskConfig, register_task


@register_task("associative-recall")
@dataclass(frozen=True, kw_only=True)
class AssociativeRecallTask(TaskConfig):
    """Zoology's MQAR: key-value pairs, then queries of every key; scored on the recalled values."""

    seq_len: int = 256
    vocab_size: int = 8192
    num_kv_pairs: int = 16
    power_a: float = 0.01  # Zoology's gap distribution p(g) ~ g^(a-1); 1.0 = uniform
    random_non_queries: bool = True  # filler tokens random (Zoology default) instead of 0

    def __post_init__(self) -> None:
        super().__post_init__()
        n, v, p = self.seq_len, self.vocab_size, self.num_kv_pairs
        problems = []
        if n % 2:
            problems.append(f"seq_len must be even, got {n}")
        if p < 1:
            problems.append(f"num_kv_pairs must be >= 1, got {p}")
        if 4 * p > n:
            problems.append(
                f"4 * num_kv_pairs must be <= seq_len (context + queries), got {4 * p} > {n}"
            )
        if v // 2 - 1 < p:
            problems.append(f"vocab_size // 2 - 1 = {v // 2 - 1} keys cannot give {p} unique keys")
        if not 0 < self.power_a <= 1:
            problems.append(f"power_a must be in (0, 1], got {self.power_a}")
        if problems:
            raise ConfigError(f"{self.name}: " + "; ".join(problems))

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        b, p = batch_size, self.num_kv_pairs
        key_vocab = self.vocab_size // 2
        # Unique keys (and values) per sequence: the first p of a random permutation.
        keys = torch.rand(b, key_vocab - 1, generator=generator).argsort(-1)[:, :p] + 1
        values = torch.rand(b, self.vocab_size - key_vocab, generator=generator).argsort(-1)[:, :p]
        values = values + key_vocab
        context = torch.stack([keys, values], dim=-1).flatten(1)  # (b, 2p): k v k v ...
        return self.with_queries(context, keys, values, generator)

    def with_queries(
        self, context: Tensor, keys: Tensor, answers: Tensor, generator: torch.Generator
    ) -> Batch:
        """context (b, c), then each of keys (b, p) once as a query, scored on answers (b, p)."""
        b, n, p = keys.shape[0], self.seq_len, keys.shape[1]
        c = context.shape[1]
        # Query slots: distinct even offsets in the query region, favouring short gaps.
        slots = (n - c) // 2
        gap_weights = self.power_a * torch.arange(1, slots + 1, dtype=torch.float64) ** (
            self.power_a - 1
        )
        gaps = torch.multinomial(
            gap_weights.expand(b, slots), p, replacement=False, generator=generator
        )
        query_pos = c + 2 * gaps  # (b, p) absolute positions of the query keys
        if self.random_non_queries:
            input_ids = torch.randint(0, self.vocab_size, (b, n), generator=generator)
        else:
            input_ids = torch.zeros(b, n, dtype=torch.long)
        input_ids[:, :c] = context
        input_ids.scatter_(1, query_pos, keys)
        labels = torch.full((b, n), IGNORE_INDEX, dtype=torch.long)
        labels.scatter_(1, query_pos + 1, answers)  # predicted at the token after the query key
        return Batch(input_ids, labels)

    def chance_accuracy(self) -> float:
        return 1.0 / (self.vocab_size - self.vocab_size // 2)
