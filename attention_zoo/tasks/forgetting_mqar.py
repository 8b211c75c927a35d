"""Forgetting MQAR, as in Zoology (HazyResearch/zoology `zoology/data/forgetting_mqar.py`).

MQAR (associative_recall.py) whose context binds `num_updates` of its keys a second time, to a new
value, after all the pairs; every key is queried once and the answer is its latest value. A
mechanism that overwrites a key's slot (the delta rule) can answer; one that only adds to it
(linear attention) holds both values. The rule "recall the first binding" scores
(num_kv_pairs - num_updates) / num_kv_pairs: the task's baseline.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import ConfigError
from .associative_recall import AssociativeRecallTask
from .base import Batch, register_task


@register_task("forgetting-mqar")
@dataclass(frozen=True, kw_only=True)
class ForgettingMQARTask(AssociativeRecallTask):
    """Key-value pairs, then new values for some keys; each key queried for its latest value."""

    num_kv_pairs: int = 8  # Zoology's default
    num_updates: int = 4  # keys bound again, to a value other than their first

    def __post_init__(self) -> None:
        super().__post_init__()
        p, u, n = self.num_kv_pairs, self.num_updates, self.seq_len
        problems = []
        if not 0 <= u <= p:
            problems.append(f"num_updates must be in 0..num_kv_pairs = {p}, got {u}")
        elif 2 * (p + u) + 2 * p > n:
            problems.append(
                f"2 * (num_kv_pairs + num_updates) + 2 * num_kv_pairs must be <= seq_len "
                f"(context + queries), got {2 * (p + u) + 2 * p} > {n}"
            )
        if problems:
            raise ConfigError("forgetting-mqar: " + "; ".join(problems))

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        b, p, u = batch_size, self.num_kv_pairs, self.num_updates
        key_vocab = self.vocab_size // 2
        num_values = self.vocab_size - key_vocab
        keys = torch.rand(b, key_vocab - 1, generator=generator).argsort(-1)[:, :p] + 1
        first = torch.rand(b, num_values, generator=generator).argsort(-1)[:, :p]
        # which keys are bound again (in a random order), and a new value != the first one
        rebound = torch.rand(b, p, generator=generator).argsort(-1)[:, :u]
        shift = torch.randint(1, num_values, (b, u), generator=generator)
        new = (first.gather(1, rebound) + shift) % num_values
        latest = first.scatter(1, rebound, new)
        pairs = torch.stack([keys, first + key_vocab], dim=-1).flatten(1)  # (b, 2p)
        updates = torch.stack([keys.gather(1, rebound), new + key_vocab], dim=-1).flatten(1)
        context = torch.cat([pairs, updates], dim=1)  # (b, 2(p + u))
        return self.with_queries(context, keys, latest + key_vocab, generator)

    def baseline_accuracy(self) -> float:
        """Recalling each key's first value: right for the keys never bound again."""
        return (self.num_kv_pairs - self.num_updates) / self.num_kv_pairs
