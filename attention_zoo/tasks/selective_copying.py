"""Selective copying, the Mamba paper's task (Gu & Dao 2023, section 4.1.1, Table 1; appendix E.1).

As the generator of state-spaces/s4 `src/dataloaders/datasets/copying.py` with `variable=True`
(and athms/mad-lab `generate_selective_copying_instance`): `num_tokens` data tokens (1..V-2) at
random positions among blanks (0), then a copy token (V-1) and blanks; the model must write the
data tokens in order, one per position after the copy token. Copying is easy; choosing which
tokens to keep, when their positions vary, needs a selection that depends on the content.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import ConfigError
from .base import IGNORE_INDEX, Batch, TaskConfig, register_task

BLANK = 0  # noise between the data tokens, and the inputs while the model writes them


@register_task("selective-copying")
@dataclass(frozen=True, kw_only=True)
class SelectiveCopyingTask(TaskConfig):
    """Data tokens scattered among blanks, then a copy token: write the data tokens in order."""

    seq_len: int = 4096  # the Mamba paper: 4096
    vocab_size: int = 16  # the Mamba paper: 16; blank 0, copy token V-1, data 1..V-2
    num_tokens: int = 16  # data tokens to copy; the Mamba paper: 16

    def __post_init__(self) -> None:
        super().__post_init__()
        n, m, v = self.seq_len, self.num_tokens, self.vocab_size
        if m < 1 or v < 3 or 2 * m + 1 > n:
            raise ConfigError(
                "selective-copying needs num_tokens >= 1, vocab_size >= 3 (blank, copy token, a "
                f"data token) and seq_len >= 2 * num_tokens + 1, got seq_len={n}, "
                f"vocab_size={v}, num_tokens={m}"
            )

    @property
    def copy_token(self) -> int:
        return self.vocab_size - 1

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        b, n, m = batch_size, self.seq_len, self.num_tokens
        region = n - m - 1  # the data tokens and blanks, before the copy token
        data = torch.randint(1, self.copy_token, (b, m), generator=generator)
        # m distinct positions of the region, in increasing order (the order to copy)
        at = torch.rand(b, region, generator=generator).argsort(-1)[:, :m].sort(-1).values
        input_ids = torch.full((b, n), BLANK, dtype=torch.long)
        input_ids.scatter_(1, at, data)
        input_ids[:, region] = self.copy_token
        labels = torch.full_like(input_ids, IGNORE_INDEX)
        labels[:, region + 1 :] = data  # the first predicted having read the copy token
        return Batch(input_ids, labels)

    def chance_accuracy(self) -> float:
        return 1.0 / (self.vocab_size - 2)
