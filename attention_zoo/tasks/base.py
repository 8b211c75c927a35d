"""Task engine basics: a task is a frozen config that builds its own data from a seed and declares
how its stored results are tabulated (`tabulation`).

A built task gives fresh training batches every step (an endless seeded stream), one fixed
evaluation set (read while training: when to stop), one fixed test set held out of both (what a
run reports), and the fixed evaluation splits the task declares (`eval_splits`: e.g. longer
lengths or needle depths), each scored on its own after training. Token tasks' `labels` follow the
Hugging Face causal-LM convention: labels[:, i] is the token the model must produce at position i
having seen only positions < i (the model shifts), -100 where nothing is scored, so loss and metric
count exactly the scored positions. A sequence classification task (`num_classes` set) has one
label per sequence: labels (b,).
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import torch
from torch import Tensor

from ..declarative import check_count, check_field_types, checked_dataclass
from ..errors import ConfigError, OptionError, did_you_mean
from ..model import IGNORE_INDEX
from ..registry import Registry
from .tabulate import TrainEvalMatrix

# Independent streams derived from one run seed, so changing the eval set size never changes the
# training data, and model init (torch.manual_seed(seed)) never shares a stream with the data.
_TRAIN_STREAM, _EVAL_STREAM, _TEST_STREAM = 1, 2, 4
EVAL_HASH_STREAM = 3  # LSH rotations when a trained model is evaluated (the runner's)
_PROBE_STREAM = 5  # draws that measure how much of a task the held-out sets take
_SPLIT_STREAMS = 1000  # + crc32(label): one stream per evaluation split, named by its label


@dataclass(frozen=True)
class Batch:
    """Token ids (b, n) and labels: (b, n), the expected token where scored and IGNORE_INDEX
    elsewhere; or (b,), one class per sequence (sequence classification). attention_mask (b, n)
    bool, True = real token, when the task pads its sequences (padding is masked as keys)."""

    input_ids: Tensor
    labels: Tensor
    attention_mask: Tensor | None = None

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device: torch.device | str) -> Batch:
        mask = None if self.attention_mask is None else self.attention_mask.to(device)
        return Batch(self.input_ids.to(device), self.labels.to(device), mask)

    def scored(self) -> Tensor:
        """(b, n) bool: the positions whose token the metric counts."""
        return self.labels != IGNORE_INDEX

    def split(self, size: int) -> list[Batch]:
        return [self.rows(slice(i, i + size)) for i in range(0, len(self), size)]

    def rows(self, index: Tensor | slice) -> Batch:
        """The sequences at `index` (a slice, or a bool or index tensor over the batch)."""
        mask = None if self.attention_mask is None else self.attention_mask[index]
        return Batch(self.input_ids[index], self.labels[index], mask)

    @staticmethod
    def cat(parts: list[Batch]) -> Batch:
        masks = [p.attention_mask for p in parts]
        return Batch(
            torch.cat([p.input_ids for p in parts]),
            torch.cat([p.labels for p in parts]),
            None if any(m is None for m in masks) else torch.cat(masks),  # type: ignore[arg-type]
        )


def stream_seed(seed: int, stream: int) -> int:
    """A 63-bit seed for one named stream of a run seed (stable across Python versions)."""
    g = torch.Generator().manual_seed(int(seed) * 1_000_003 + stream)
    return int(torch.randint(0, 2**62, (1,), generator=g))


@dataclass(frozen=True, kw_only=True)
class TaskConfig:
    """Base class of task configs: subclasses add their fields and implement `sample`."""

    name: ClassVar[str] = ""
    # None: next-token prediction (a causal LM); else classes of a sequence classification task
    # (a bidirectional encoder with a pooled head)
    num_classes: ClassVar[int | None] = None
    # how the report and `zoo task --table2` tabulate this task's stored runs
    tabulation: ClassVar[TrainEvalMatrix] = TrainEvalMatrix()
    seq_len: int  # tokens per sequence, the model's input length
    vocab_size: int  # token ids are 0 .. vocab_size - 1
    eval_size: int = 512  # sequences in the fixed evaluation set, and in the held-out test set

    def __post_init__(self) -> None:
        for name, least in (("seq_len", 2), ("vocab_size", 2), ("eval_size", 1)):
            check_count(getattr(self, name), f"{self.name}: {name}", minimum=least)
        check_field_types(self)

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        """`batch_size` fresh sequences drawn with `generator` (CPU)."""
        raise NotImplementedError

    def eval_splits(self) -> dict[str, TaskConfig]:
        """Evaluation splits scored after training beside the evaluation set: label -> the task
        config drawing the split (its `eval_size` sequences); stored as `accuracy@<label>`."""
        return {}

    def max_positions(self) -> int:
        """The longest sequence the model must accept: this task's or one of its splits'."""
        return max([self.seq_len, *(s.seq_len for s in self.eval_splits().values())])

    def chance_accuracy(self) -> float:
        """Accuracy of a uniform guess over the symbols that can appear at a scored position."""
        raise NotImplementedError

    def baseline_accuracy(self) -> float | None:
        """The accuracy of the best shallow rule the task names (one that reads part of the input
        and does not solve the task), computed from the generator; None: none beyond chance."""
        return None

    def examples(self, batch: Batch) -> list[dict[str, Any]]:
        """JSON-friendly examples: token ids, and the scored targets (None where not scored)."""
        return [
            {
                "input": ids.tolist(),
                "target": [None if t == IGNORE_INDEX else t for t in lab.tolist()],
            }
            for ids, lab in zip(batch.input_ids, batch.labels)
        ]

    def first_examples(
        self, seed: int, n: int, batch_size: int | None = None
    ) -> Iterator[dict[str, Any]]:
        """The first `n` training sequences of run seed `seed`, as a run drawing batches of
        `batch_size` (None: one batch of n) trains on them, a batch at a time: evaluation and
        test sequences held out."""
        left = n
        for batch in self.build(seed).batches(batch_size or n):
            yield from self.examples(batch)[:left]
            left -= min(left, len(batch.input_ids))
            if not left:
                return

    def split_examples(self, seed: int, label: str, n: int) -> list[dict[str, Any]]:
        """The first `n` sequences of evaluation split `label` of run seed `seed`, as a run of
        that seed scores them."""
        splits = self.eval_splits()
        if label not in splits:
            known = ", ".join(splits) or "(none)"
            raise OptionError(
                f"task {self.name!r} has no evaluation split {label!r}; its splits: {known}"
                + did_you_mean(label, splits)
            )
        split = splits[label]
        batch = split.sample(split.eval_size, split_generator(seed, label))
        return split.examples(batch.rows(slice(0, n)))

    def build(self, seed: int) -> TaskData:
        """The data of one run: a seeded training stream, a fixed evaluation set, a fixed test set
        disjoint from it, and the fixed evaluation splits (each from its own stream, so adding a
        split changes no other data)."""
        eval_set = self.sample(self.eval_size, _generator(seed, _EVAL_STREAM))
        held_out = _row_keys(eval_set)
        test_set, met = draw_excluding(
            self, self.eval_size, _generator(seed, _TEST_STREAM), held_out
        )
        held_out |= _row_keys(test_set)
        if met:  # a test draw that met no evaluation sequence leaves the task far from the limit
            _refuse_a_held_out_majority(self, seed, held_out)
        return TaskData(
            task=self,
            seed=seed,
            eval_set=eval_set,
            test_set=test_set,
            held_out=held_out,
            train_generator=_generator(seed, _TRAIN_STREAM),
            splits={
                label: split.sample(split.eval_size, split_generator(seed, label))
                for label, split in self.eval_splits().items()
            },
        )

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.name, **dataclasses.asdict(self)}


MAX_REDRAWS = 100  # rounds of replacing drawn held-out sequences before a task is refused
MAX_HELD_OUT_SHARE = 0.5  # of a task's draws the evaluation and test sets may take together
PROBE_DRAWS = 1024  # draws that estimate that share (a standard error of at most 1.6 points)
_SMALLER = "lower eval_size or enlarge the task (a longer seq_len or more symbols)"


@dataclass
class TaskData:
    """The data of one run of one task; `batches` continues the same seeded stream on every call.

    Training, the evaluation set and the test set are disjoint: a drawn sequence already in an
    earlier set is dropped and replaced by its stream's next one (`dropped` counts the training
    stream's). The evaluation set decides when training stops, so what a run reports is scored on
    the test set, which nothing during training reads. The fixed splits are not held out (at
    lengths other than seq_len they cannot repeat a row)."""

    task: TaskConfig
    seed: int
    eval_set: Batch
    test_set: Batch
    held_out: set[bytes]  # row keys of the evaluation and test sets: what training never draws
    train_generator: torch.Generator
    dropped: int = 0
    splits: dict[str, Batch] = field(default_factory=dict)  # label -> its fixed sequences

    def batches(self, batch_size: int) -> Iterator[Batch]:
        """An endless stream of fresh training batches, none holding an evaluation or test
        sequence."""
        while True:
            batch, dropped = draw_excluding(
                self.task, batch_size, self.train_generator, self.held_out
            )
            self.dropped += dropped
            yield batch


def draw_excluding(
    task: TaskConfig, size: int, generator: torch.Generator, excluded: set[bytes]
) -> tuple[Batch, int]:
    """`size` sequences of `generator`'s stream none of which is in `excluded` (row keys), each
    excluded one drawn replaced by another draw, up to MAX_REDRAWS rounds; and how many were
    replaced."""
    parts, wanted, dropped = [], size, 0
    for _ in range(MAX_REDRAWS):
        batch = task.sample(wanted, generator)
        keep = torch.tensor([_row_key(ids) not in excluded for ids in batch.input_ids])
        wanted = int((~keep).sum())
        dropped += wanted
        parts.append(batch.rows(keep) if wanted else batch)
        if not wanted:
            return (parts[0] if len(parts) == 1 else Batch.cat(parts)), dropped
    raise ConfigError(
        f"{task.name}: the evaluation and test sets hold (nearly) every sequence the task can "
        f"draw, so no sequence outside them is left after {MAX_REDRAWS} draws; {_SMALLER}"
    )


def _refuse_a_held_out_majority(task: TaskConfig, seed: int, held_out: set[bytes]) -> None:
    """A one-line ConfigError when the held-out sets are most of what the task draws, so training
    would be left few sequences (near the limit, an estimate: some seeds may pass)."""
    probe = task.sample(PROBE_DRAWS, _generator(seed, _PROBE_STREAM))
    met = len([ids for ids in probe.input_ids if _row_key(ids) in held_out])
    if met > MAX_HELD_OUT_SHARE * PROBE_DRAWS:
        raise ConfigError(
            f"{task.name}: its evaluation and test sets are {met / PROBE_DRAWS:.1%} of the "
            f"sequences it draws ({met} of {PROBE_DRAWS} draws), so training would be left few "
            f"others (at most {MAX_HELD_OUT_SHARE:.0%} works); {_SMALLER}"
        )


def split_generator(seed: int, label: str) -> torch.Generator:
    """The generator of evaluation split `label` of run seed `seed`."""
    return _generator(seed, _SPLIT_STREAMS + zlib.crc32(label.encode()))


def _generator(seed: int, stream: int) -> torch.Generator:
    return torch.Generator().manual_seed(stream_seed(seed, stream))


def _row_key(ids: Tensor) -> bytes:
    return ids.numpy().tobytes()


def _row_keys(batch: Batch) -> set[bytes]:
    return {_row_key(ids) for ids in batch.input_ids}


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
        get_task(name), fields, where=f"task {name!r}", noun="field", error=OptionError, tuples=True
    )
