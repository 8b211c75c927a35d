"""Needle in a haystack as RULER builds it (Hsieh et al. 2024, NVIDIA/RULER
`scripts/data/synthetic/niah.py`), in tokens: needles `NEEDLE key value` at depths 0..1 of a
haystack, then a `QUERY key v1 .. vV` block per asked key, scored on its values (in the order the
needles appear). The scored slots hold ANSWER (hidden answers: each value predicted from the context
alone, as Zoology's MQAR asks its queries) or, with answers="shown", the values themselves
(teacher-forced, as RULER's models generate them: an answer given rules itself out of the next).
RULER's variants: single; multikey (distractor keys); multivalue (all of one key's values);
multiquery (every key asked). A ladder of lengths is trained together; each (length, depth) is an
evaluation split.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from ..errors import ConfigError
from .base import IGNORE_INDEX, Batch, TaskConfig, register_task
from .tabulate import SplitMatrix

PAD, NEEDLE, QUERY, ANSWER = 0, 1, 2, 3  # then filler tokens, then keys, then values
FIRST_FILLER = 4
BASELINE_DRAWS = 2000  # sequences the key-blind rules are scored on (s.e. about 1 point)
VARIANTS = ("single", "multikey", "multivalue", "multiquery")
HAYSTACKS = ("noise", "essay", "needle")
ANSWERS = ("hidden", "shown")


@register_task("niah")
@dataclass(frozen=True, kw_only=True)
class NeedleTask(TaskConfig):
    """RULER's needle-in-a-haystack variants over a ladder of lengths, scored on the values."""

    tabulation = SplitMatrix()
    seq_len: int = 4096  # the longest length; shorter sequences end in PAD, never read (causal)
    vocab_size: int = 1024  # PAD, NEEDLE, QUERY, ANSWER, filler, keys, values
    variant: str = "single"  # single, multikey, multivalue or multiquery (RULER's niah_*)
    # noise (one repeated pattern: RULER's repeat), essay (random filler for RULER's essays) or
    # needle (needles of keys never asked: RULER's multikey_2/3)
    haystack: str = "essay"
    # hidden: a scored slot holds ANSWER; shown: the value it scores (teacher-forced, RULER's
    # generation order), which lets a rule that never reads the asked key rule out given values
    answers: str = "hidden"
    num_needles: int = 4  # keys (multikey, multiquery) or values (multivalue); RULER: 4
    num_keys: int = 256  # key tokens
    num_values: int = 256  # value tokens: chance is 1 / num_values
    lengths: tuple[int, ...] = ()  # the ladder trained and evaluated; () = (seq_len,)
    depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)  # evaluated depths (0 = first)
    depth: float | None = None  # queried needles' depth; None = each needle uniform in 0..1
    split_size: int = 128  # sequences in each (length, depth) evaluation split

    def __post_init__(self) -> None:
        object.__setattr__(self, "lengths", tuple(self.lengths) or (self.seq_len,))
        object.__setattr__(self, "depths", tuple(float(d) for d in self.depths))
        super().__post_init__()
        problems = []
        if self.variant not in VARIANTS:
            problems.append(f"variant must be one of {', '.join(VARIANTS)}, got {self.variant!r}")
        if self.haystack not in HAYSTACKS:
            problems.append(
                f"haystack must be one of {', '.join(HAYSTACKS)}, got {self.haystack!r}"
            )
        if self.answers not in ANSWERS:
            problems.append(f"answers must be one of {', '.join(ANSWERS)}, got {self.answers!r}")
        if problems:  # the layout below depends on these
            raise ConfigError("niah: " + "; ".join(problems))
        if self.variant != "single" and self.num_needles < 2:
            problems.append(f"num_needles must be >= 2 for {self.variant}, got {self.num_needles}")
        if self.filler_tokens < 1:
            problems.append(
                f"vocab_size must be > {FIRST_FILLER} + num_keys + num_values = "
                f"{FIRST_FILLER + self.num_keys + self.num_values} (a filler token at least), "
                f"got {self.vocab_size}"
            )
        spare = 1 if self.haystack == "needle" else 0  # keys for the haystack's needles
        if self.num_keys < self.keys_per_sequence + spare or self.num_values < 2:
            problems.append(
                f"need num_keys >= {self.keys_per_sequence + spare} and num_values >= 2, got "
                f"{self.num_keys}, {self.num_values}"
            )
        if list(self.lengths) != sorted(set(self.lengths)) or self.lengths[-1] > self.seq_len:
            problems.append(
                f"lengths must increase up to seq_len {self.seq_len}, got {self.lengths}"
            )
        elif (shortest := self.lengths[0]) < (least := self.shortest_length()):
            problems.append(f"lengths must be >= {least} (one haystack unit), got {shortest}")
        if not all(0 <= d <= 1 for d in (*self.depths, self.depth or 0.0)):
            problems.append(f"depths must be in 0..1, got {self.depths}, depth {self.depth}")
        percents = [round(100 * d) for d in self.depths]
        if len(set(percents)) < len(percents):  # they name the evaluation splits
            problems.append(f"depths must differ in whole percents, got {self.depths}")
        if self.split_size < 1:
            problems.append(f"split_size must be >= 1, got {self.split_size}")
        if problems:
            raise ConfigError("niah: " + "; ".join(problems))

    # ---- layout -----------------------------------------------------------------------------

    @property
    def filler_tokens(self) -> int:
        return self.vocab_size - FIRST_FILLER - self.num_keys - self.num_values

    @property
    def keys_per_sequence(self) -> int:
        """Distinct keys among the needles (RULER's num_needle_k)."""
        return self.num_needles if self.variant in ("multikey", "multiquery") else 1

    @property
    def values_per_key(self) -> int:
        """Needles per key (RULER's num_needle_v)."""
        return self.num_needles if self.variant == "multivalue" else 1

    @property
    def queries(self) -> int:
        """Keys asked (RULER's num_needle_q)."""
        return self.num_needles if self.variant == "multiquery" else 1

    @property
    def needles(self) -> int:
        return self.keys_per_sequence * self.values_per_key

    @property
    def query_tokens(self) -> int:
        """Tokens of the query region: QUERY key v1 .. vV per queried key."""
        return self.queries * (2 + self.values_per_key)

    @property
    def unit(self) -> int:
        """Tokens of one haystack unit: a filler token, or a needle of the `needle` haystack."""
        return 3 if self.haystack == "needle" else 1

    def shortest_length(self) -> int:
        """The shortest sequence with a haystack unit: the needles, one unit, the queries."""
        return 3 * self.needles + self.unit + self.query_tokens

    def haystack_units(self, length: int) -> int:
        """Haystack units of a sequence of `length` tokens (the needle haystack's remainder of
        fewer than 3 tokens opens the sequence as filler)."""
        return (length - self.query_tokens - 3 * self.needles) // self.unit

    def token_ranges(self) -> dict[str, range]:
        """Which ids are filler, keys and values."""
        keys = FIRST_FILLER + self.filler_tokens
        values = keys + self.num_keys
        return {
            "filler": range(FIRST_FILLER, keys),
            "keys": range(keys, values),
            "values": range(values, self.vocab_size),
        }

    # ---- data -------------------------------------------------------------------------------

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        ladder = torch.tensor(self.lengths)
        lengths = ladder[torch.randint(0, len(ladder), (batch_size,), generator=generator)]
        input_ids = torch.full((batch_size, self.seq_len), PAD, dtype=torch.long)
        labels = torch.full_like(input_ids, IGNORE_INDEX)
        for length in self.lengths:  # rows of one length are drawn together
            rows = (lengths == length).nonzero().flatten()
            if len(rows):
                ids, lab = self._draw(len(rows), int(length), generator)
                input_ids[rows, :length], labels[rows, :length] = ids, lab
        return Batch(input_ids, labels)

    def _draw(self, b: int, length: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        """b sequences of exactly `length` tokens and their labels."""
        ranges = self.token_ranges()
        k, v, w = self.keys_per_sequence, self.values_per_key, self.unit
        units = self.haystack_units(length)
        context = length - self.query_tokens
        prefix = context - 3 * self.needles - w * units  # the `needle` haystack's remainder (< 3)
        # distinct keys per sequence; needle i has key key_order[:, i // v] and value values[:, i]
        key_order = torch.rand(b, self.num_keys, generator=gen).argsort(-1) + ranges["keys"][0]
        values = torch.randint(0, self.num_values, (b, self.needles), generator=gen)
        values = values + ranges["values"][0]
        # insertion points (haystack units before each needle); the queried needles at `depth`
        where = torch.randint(0, units + 1, (b, self.needles), generator=gen)
        if self.depth is not None:
            queried = slice(None) if self.variant == "multiquery" else slice(0, v)
            where[:, queried] = round(self.depth * units)
        haystack = self._haystack(b, units, key_order, gen)
        asked_keys, asked_values = self._asked(key_order, values, where, gen)
        # token positions: each needle after its units and the needles read before it
        order = where.argsort(dim=1, stable=True)  # needles in reading order
        sorted_where = where.gather(1, order)
        needle_at = prefix + w * sorted_where + 3 * torch.arange(self.needles)  # (b, N)
        j = torch.arange(units)
        before = (sorted_where.unsqueeze(1) <= j.view(1, -1, 1)).sum(-1)  # (b, units)
        unit_at = prefix + w * j + 3 * before  # (b, units)
        ids = torch.full((b, length), FIRST_FILLER, dtype=torch.long)
        for offset, tokens in enumerate(haystack):
            ids.scatter_(1, unit_at + offset, tokens)
        needle_keys = key_order[:, :k].repeat_interleave(v, dim=1)
        ids.scatter_(1, needle_at, NEEDLE)
        ids.scatter_(1, needle_at + 1, needle_keys.gather(1, order))
        ids.scatter_(1, needle_at + 2, values.gather(1, order))
        # the query region: QUERY key v1 .. vV per asked key, the values scored
        labels = torch.full_like(ids, IGNORE_INDEX)
        block = 2 + v
        for q in range(self.queries):
            at = context + q * block
            answer = asked_values[:, q * v : (q + 1) * v]
            ids[:, at], ids[:, at + 1] = QUERY, asked_keys[:, q]
            labels[:, at + 2 : at + block] = answer
            ids[:, at + 2 : at + block] = answer if self.answers == "shown" else ANSWER
        return ids, labels

    def _haystack(
        self, b: int, units: int, key_order: Tensor, gen: torch.Generator
    ) -> list[Tensor]:
        """The haystack units' tokens, one (b, units) tensor per token of a unit."""
        filler = self.token_ranges()["filler"]
        if self.haystack == "noise":  # one fixed pattern, as RULER repeats one sentence
            return [(torch.arange(units) % len(filler) + filler[0]).expand(b, units)]
        if self.haystack == "essay":
            return [torch.randint(filler[0], filler[-1] + 1, (b, units), generator=gen)]
        # needles of keys that no real needle has (key_order[:, k:])
        pick = torch.randint(self.keys_per_sequence, self.num_keys, (b, units), generator=gen)
        values = torch.randint(0, self.num_values, (b, units), generator=gen)
        marks = torch.full((b, units), NEEDLE, dtype=torch.long)
        return [marks, key_order.gather(1, pick), values + self.token_ranges()["values"][0]]

    def _asked(
        self, key_order: Tensor, values: Tensor, where: Tensor, gen: torch.Generator
    ) -> tuple[Tensor, Tensor]:
        """The asked keys (b, q) and their values (b, q * v), each key's in reading order."""
        if self.variant == "multiquery":  # every key asked once, in a random order
            asked = torch.rand(values.shape, generator=gen).argsort(-1)
            return key_order.gather(1, asked), values.gather(1, asked)
        # the first key: its one needle, or (multivalue) all of them, in reading order
        v = self.values_per_key
        reading = where[:, :v].argsort(dim=1, stable=True)
        return key_order[:, :1], values[:, :v].gather(1, reading)

    def eval_splits(self) -> dict[str, TaskConfig]:
        """One split per (length, depth): n<length>-d<depth in percent>."""
        return {
            f"n{length}-d{round(100 * d)}": dataclasses.replace(
                self,
                seq_len=length,
                lengths=(length,),
                depths=(),
                depth=d,
                eval_size=self.split_size,
            )
            for length in self.lengths
            for d in self.depths
        }

    def chance_accuracy(self) -> float:
        return 1.0 / self.num_values

    def baseline_accuracy(self) -> float:
        """The best of three key-blind rules, which read the context's values and the answers
        already given (when shown), never the asked key: the first value not yet given, in
        reading order, the last one, or one of them at random. In random filler one key's needles
        hold the only values, and with shown answers each one leaves a candidate fewer.
        A floor, not a ceiling: other key-blind rules may score more on some variants."""
        return max(self.key_blind_rules().values())

    def key_blind_rules(self) -> dict[str, float]:
        """Each key-blind rule's accuracy (baseline_accuracy's), from BASELINE_DRAWS sequences."""
        return dict(zip(("first", "last", "at random"), _key_blind_accuracies(self)))


BASELINE_BATCH = 100  # sequences drawn at a time for the rules (bounds their memory)


@functools.cache
def _key_blind_accuracies(task: NeedleTask) -> tuple[float, float, float]:
    generator = torch.Generator().manual_seed(0)
    values = task.token_ranges()["values"]
    hits, scored = [0.0, 0.0, 0.0], 0  # first, last, at random
    for _ in range(BASELINE_DRAWS // BASELINE_BATCH):
        batch = task.sample(BASELINE_BATCH, generator)
        ids, labels = batch.input_ids, batch.labels
        context = torch.cumsum(ids == QUERY, dim=1) == 0  # before the first query block
        is_value = context & (ids >= values[0]) & (ids <= values[-1])
        for row in range(BASELINE_BATCH):
            left = ids[row][is_value[row]].tolist()  # the context's values, in reading order
            for label in labels[row][labels[row] != IGNORE_INDEX].tolist():
                scored += 1
                if label in left:
                    hits[0] += left[0] == label
                    hits[1] += left[-1] == label
                    hits[2] += 1 / len(set(left))
                    if task.answers == "shown":  # in the input from here on
                        left.remove(label)
    return hits[0] / scored, hits[1] / scored, hits[2] / scored
