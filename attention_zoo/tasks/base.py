"""Task engine basics: a task is a frozen config that builds its own data from a seed and declares
how its stored results are tabulated (`tabulation`).

A built task gives fresh training batches every step (an endless seeded stream) and one fixed
evaluation set. `labels` follow the Hugging Face causal-LM convention: labels[:, i] is the token the
model must produce at position i having seen only positions < i (the model shifts), -100 where
nothing is scored, so loss and metric count exactly the scored positions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import torch
from torch import Tensor

from ..declarative import checked_dataclass
from ..errors import ConfigError, OptionError
from ..model import IGNORE_INDEX
from ..registry import Registry
from .tabulate import TrainEvalMatrix

# Independent streams derived from one run seed, so changing the eval set size never changes the
# training data, and model init (torch.manual_seed(seed)) never shares a stream with the data.
_TRAIN_STREAM, _EVAL_STREAM = 1, 2


@dataclass(frozen=True)
class Batch:
    """Token ids (b, n) and labels (b, n): expected token where scored, IGNORE_INDEX elsewhere."""

    input_ids: Tensor
    labels: Tensor

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device: torch.device | str) -> Batch:
        return Batch(self.input_ids.to(device), self.labels.to(device))

    def scored(self) -> Tensor:
        """(b, n) bool: the positions whose token the metric counts."""
        return self.labels != IGNORE_INDEX

    def split(self, size: int) -> list[Batch]:
        ids, labels = self.input_ids.split(size), self.labels.split(size)
        return [Batch(i, lab) for i, lab in zip(ids, labels)]


def stream_seed(seed: int, stream: int) -> int:
    """A 63-bit seed for one named stream of a run seed (stable across Python versions)."""
    g = torch.Generator().manual_seed(int(seed) * 1_000_003 + stream)
    return int(torch.randint(0, 2**62, (1,), generator=g))


@dataclass(frozen=True, kw_only=True)
class TaskConfig:
    """Base class of task configs: subclasses add their fields and implement `sample`."""

    name: ClassVar[str] = ""
    # how the report and `zoo task --table2` tabulate this task's stored runs
    tabulation: ClassVar[TrainEvalMatrix] = TrainEvalMatrix()
    seq_len: int  # tokens per sequence, the model's input length
    vocab_size: int  # token ids are 0 .. vocab_size - 1
    eval_size: int = 512  # sequences in the fixed evaluation set

    def __post_init__(self) -> None:
        if self.seq_len < 2 or self.vocab_size < 2 or self.eval_size < 1:
            raise ConfigError(
                f"{self.name}: seq_len and vocab_size must be >= 2 and eval_size >= 1, got "
                f"seq_len={self.seq_len}, vocab_size={self.vocab_size}, eval_size={self.eval_size}"
            )

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        """`batch_size` fresh sequences drawn with `generator` (CPU)."""
        raise NotImplementedError

    def chance_accuracy(self) -> float:
        """Accuracy of a uniform guess over the symbols that can appear at a scored position."""
        raise NotImplementedError

    def build(self, seed: int) -> TaskData:
        """The data of one run: a seeded training stream and a fixed evaluation set."""
        eval_gen = torch.Generator().manual_seed(stream_seed(seed, _EVAL_STREAM))
        return TaskData(
            task=self,
            seed=seed,
            eval_set=self.sample(self.eval_size, eval_gen),
            train_generator=torch.Generator().manual_seed(stream_seed(seed, _TRAIN_STREAM)),
        )

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.name, **dataclasses.asdict(self)}


@dataclass
class TaskData:
    """The data of one run of one task; `batches` continues the same seeded stream on every call."""

    task: TaskConfig
    seed: int
    eval_set: Batch
    train_generator: torch.Generator

    def batches(self, batch_size: int) -> Iterator[Batch]:
        """An endless stream of fresh training batches."""
        while True:
            yield self.task.sample(batch_size, self.train_generator)


C = TypeVar("C", bound=type[TaskConfig])
TASKS: Registry[type[TaskConfig]] = Registry("task")


def register_task(name: str, *, replace: bool = False) -> Callable[[C], C]:
    """Class decorator: register a TaskConfig subclass under `name` (usable from user code)."""

    def wrap(cls: C) -> C:
        if not (isinstance(cls, type) and issubclass(cls, TaskConfig)):
            raise TypeError(f"task {name!r} must be a TaskConfig subclass, got {cls!r}")
        cls.name = name
        TASKS.add(name, cls, replace=replace)
        return cls

    return wrap


def get_task(name: str) -> type[TaskConfig]:
    return TASKS.get(name)


def tabulation_of(name: str) -> TrainEvalMatrix:
    """How task `name`'s stored runs are tabulated; the default for a task not registered here
    (a store written with a plugin that is not loaded)."""
    return TASKS.get(name).tabulation if name in TASKS else TrainEvalMatrix()


def make_task(name: str, **fields: Any) -> TaskConfig:
    """Build the task config `name`; unknown fields raise listing the accepted ones."""
    return checked_dataclass(
        get_task(name), fields, where=f"task {name!r}", noun="field", error=OptionError
    )
