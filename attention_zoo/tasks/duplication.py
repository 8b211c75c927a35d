"""The duplication task of the Reformer paper (Kitaev et al. 2020, section 5, Table 2).

Sequences `0 w 0 w`: `w` is seq_len/2 - 1 symbols drawn uniformly from 1..V-1; loss and accuracy
count only the second copy, which a model can produce only by looking back seq_len/2 positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import ConfigError
from .base import IGNORE_INDEX, Batch, TaskConfig, register_task


@register_task("duplication")
@dataclass(frozen=True, kw_only=True)
class DuplicationTask(TaskConfig):
    """Copy a random string: `0 w 0 w`, scored on the second `w`."""

    seq_len: int = 1024  # paper: 1024
    vocab_size: int = 128  # paper: 128; symbol 0 is the separator

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.seq_len % 2 or self.seq_len < 4 or self.vocab_size < 3:
            raise ConfigError(
                f"duplication needs an even seq_len >= 4 and vocab_size >= 3 (0 is the separator), "
                f"got seq_len={self.seq_len}, vocab_size={self.vocab_size}"
            )

    @property
    def half(self) -> int:
        """Length of one `0 w` half; the copy distance."""
        return self.seq_len // 2

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        w = torch.randint(1, self.vocab_size, (batch_size, self.half - 1), generator=generator)
        zero = torch.zeros(batch_size, 1, dtype=w.dtype)
        input_ids = torch.cat([zero, w, zero, w], dim=1)  # (b, n)
        labels = torch.full_like(input_ids, IGNORE_INDEX)
        labels[:, self.half + 1 :] = w  # the second copy only
        return Batch(input_ids, labels)

    def chance_accuracy(self) -> float:
        return 1.0 / (self.vocab_size - 1)
