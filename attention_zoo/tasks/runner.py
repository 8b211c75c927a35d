"""Expand a preset's grid into training runs, run them, evaluate with overrides and on the task's
evaluation splits, emit tidy rows.

A training variant is an attention mix (`attn_layers`) and, when it contains `lsh`, a hash count.
Every model whose layers use the shared-QK projection layout (`lsh`, `shared-qk`) is also
evaluated, weights unchanged, with those layers swapped for shared-QK full attention ("full") and
for LSH with each evaluation hash count ("lsh-8", ...): the columns of the Reformer's Table 2.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..attention.spec import RunTarget, get_backend, list_backends
from ..config import ReformerConfig
from ..errors import ConfigError
from ..model import ReformerForSequenceClassification, ReformerLM
from .base import EVAL_HASH_STREAM, stream_seed
from .results import SCORED_ON, STOP_ACCURACY, TRAINED, same_definition
from .suite import TaskPreset
from .trainer import EvalResult, TrainResult, evaluate, train

log = logging.getLogger(__name__)

LSH = "lsh"
SHARED_QK_FULL = "shared-qk"
SWAPPABLE = (LSH, SHARED_QK_FULL)  # layers an evaluation override may swap (same [qk, v] weights)
EVERY_BACKEND = "all"  # in grid.backends: every registered backend (those that cannot run skip)


@dataclass(frozen=True, kw_only=True)
class TrainVariant:
    """The attention a model is trained with."""

    label: str  # e.g. "shared-qk", "lsh-2", "local+lsh-4"
    attn_layers: tuple[str, ...]
    num_hashes: int | None = None  # None when no layer is lsh


@dataclass(frozen=True, kw_only=True)
class EvalVariant:
    """An evaluation-time override: swap the swappable layers for `backend` (weights kept)."""

    label: str  # "full" or "lsh-<h>"
    backend: str
    num_hashes: int | None = None


@dataclass(frozen=True, kw_only=True)
class Skipped:
    """A grid entry that cannot run here, with the reason."""

    label: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """One training run: preset x training variant x seed, plus its evaluation overrides."""

    preset: TaskPreset
    variant: TrainVariant
    seed: int
    evals: tuple[EvalVariant, ...]

    def model_fields(self) -> dict[str, Any]:
        """ReformerConfig fields: the preset's model table + what the task and variant fix."""
        fields = dict(self.preset.model)
        fields.update(
            attn_layers=list(self.variant.attn_layers),
            vocab_size=self.preset.task.vocab_size,
            max_position_embeddings=self.preset.task.max_positions(),
            is_decoder=is_causal(self.preset),
        )
        if "attn_options" in fields:  # a preset gives options for every backend it may train
            layers = self.variant.attn_layers
            fields["attn_options"] = {
                b: o for b, o in fields["attn_options"].items() if b in layers
            }
        if self.variant.num_hashes is not None:
            fields["num_hashes"] = self.variant.num_hashes
        # a mix of n backends has at least n layers (one of each)
        fields["num_hidden_layers"] = max(
            fields.get("num_hidden_layers") or 0, len(self.variant.attn_layers)
        )
        return fields

    def eval_hash_seed(self) -> int:
        return stream_seed(self.seed, EVAL_HASH_STREAM) % 2**31

    def key(self) -> dict[str, Any]:
        """JSON-friendly identity of the run (what a store compares to resume)."""
        return {
            **self.preset.to_dict(),
            "variant": self.variant.label,
            "model": self.model_fields(),
            "seed": self.seed,
            "evals": [e.label for e in self.evals],
            "scored_on": SCORED_ON,
        }

    def describe(self) -> str:
        return f"{self.preset.task.name}/{self.preset.name} {self.variant.label} seed {self.seed}"


@dataclass(frozen=True, kw_only=True)
class RunOutcome:
    """A finished run: the training record, the trained model on the held-out test set, and the
    result of every evaluation override and evaluation split (by label)."""

    spec: RunSpec
    result: TrainResult
    test: EvalResult
    evals: dict[str, EvalResult]


def split_mix(name: str) -> tuple[str, ...]:
    """'local+lsh' -> ('local', 'lsh')."""
    parts = tuple(p.strip() for p in name.split("+"))
    if not all(parts):
        raise ConfigError(
            f"bad attention mix {name!r}; use registry names joined by '+', e.g. 'local+lsh'"
        )
    return parts


def is_causal(preset: TaskPreset) -> bool:
    """Next-token tasks train causal decoders; sequence classification, bidirectional encoders."""
    return preset.task.num_classes is None


def expand_backends(backends: Sequence[str]) -> list[str]:
    """grid.backends with "all" replaced by every registered backend, in registration order."""
    out: list[str] = []
    for mix in backends:
        out += [s.name for s in list_backends()] if mix == EVERY_BACKEND else [mix]
    return list(dict.fromkeys(out))


def train_variants(backends: Sequence[str], train_hashes: Sequence[int]) -> list[TrainVariant]:
    """Every backend mix, mixes containing lsh once per hash count."""
    out = []
    for mix in backends:
        layers = split_mix(mix)
        if LSH in layers:
            out += [
                TrainVariant(label=f"{mix}-{h}", attn_layers=layers, num_hashes=int(h))
                for h in train_hashes
            ]
        else:
            out.append(TrainVariant(label=mix, attn_layers=layers))
    return out


def eval_variants(
    layers: Sequence[str], eval_hashes: Sequence[int], eval_full: bool
) -> list[EvalVariant]:
    """The Table 2 overrides for a model with these layers (none without lsh/shared-qk)."""
    if not any(b in SWAPPABLE for b in layers):
        return []
    out = [EvalVariant(label="full", backend=SHARED_QK_FULL)] if eval_full else []
    return out + [
        EvalVariant(label=f"lsh-{h}", backend=LSH, num_hashes=int(h)) for h in eval_hashes
    ]


def plan_runs(
    preset: TaskPreset,
    *,
    backends: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    train_hashes: Sequence[int] | None = None,
    eval_hashes: Sequence[int] | None = None,
    device: str = "cpu",
) -> tuple[list[RunSpec], list[Skipped]]:
    """The runs of a preset (grid fields overridable), and the variants skipped with their reason.

    An unknown backend name raises (a typo should stop the run), as do hash counts no backend
    uses; a registered backend that cannot run on `device` (e.g. xformers without CUDA) is
    skipped with its reason, and backends asked for that are all skipped raise.
    """
    grid = preset.grid
    given_backends, given_evals = backends, eval_hashes
    backends = expand_backends(backends if backends is not None else grid.backends)
    seeds = list(seeds if seeds is not None else grid.seeds)
    given_hashes = train_hashes
    train_hashes = list(train_hashes if train_hashes is not None else grid.train_hashes)
    eval_hashes = list(eval_hashes if eval_hashes is not None else grid.eval_hashes)
    if not backends or not seeds:
        raise ConfigError("nothing to run: give at least one backend and one seed")
    for mix in backends:
        for name in split_mix(mix):
            get_backend(name)  # UnknownNameError lists the registered backends
    with_lsh = any(LSH in split_mix(m) for m in backends)
    if with_lsh and not train_hashes:
        raise ConfigError("a mix with lsh needs at least one train hash count (--train-hashes)")
    if given_hashes is not None and not with_lsh:  # given, it would change nothing
        raise ConfigError(
            "train hash counts (--train-hashes) set lsh's num_hashes while training, and no "
            f"backend here has an lsh layer ({', '.join(backends)}): add lsh or leave them out"
        )
    swappable = any(b in SWAPPABLE for m in backends for b in split_mix(m))
    if given_evals and not swappable:  # it would change nothing
        raise ConfigError(
            "evaluation hash counts (--eval-hashes) evaluate a model with lsh or shared-qk "
            f"layers under lsh, and no backend here has one ({', '.join(backends)}): add lsh or "
            "shared-qk or leave them out"
        )
    if eval_hashes:
        _check_available(LSH, device)
    runs, skipped = [], []
    case = RunTarget(device=device, causal=is_causal(preset))
    for variant in train_variants(backends, train_hashes):
        reason = next((r for r in (_unsupported(b, case) for b in variant.attn_layers) if r), None)
        if reason:
            skipped.append(Skipped(label=variant.label, reason=reason))
            log.info("skipping %s: %s", variant.label, reason)
            continue
        evals = tuple(eval_variants(variant.attn_layers, eval_hashes, grid.eval_full))
        runs += [RunSpec(preset=preset, variant=variant, seed=int(s), evals=evals) for s in seeds]
    if given_backends is not None and not runs:  # the backends asked for: none can train here
        reasons = "; ".join(f"{s.label}: {s.reason}" for s in skipped)
        raise ConfigError(
            f"no backend asked for can train here ({reasons}); nothing was run or stored"
        )
    return runs, skipped


def build_model(spec: RunSpec, device: str = "cpu") -> nn.Module:
    """A freshly initialised model for `spec`, seeded by the run seed: a ReformerLM, or for a
    classification task a ReformerForSequenceClassification."""
    config = ReformerConfig.from_dict(spec.model_fields())
    torch.manual_seed(spec.seed)  # init, then the LSH rotations drawn while training
    if (classes := spec.preset.task.num_classes) is not None:
        model = ReformerForSequenceClassification(config, num_labels=classes, device=device)
        return model.to(device)
    return ReformerLM(config, device=device).to(device)


def with_attention(model: nn.Module, override: EvalVariant, hash_seed: int) -> nn.Module:
    """A copy of `model` (weights shared by value) whose lsh/shared-qk layers use `override`."""
    view = copy.deepcopy(model)
    present = [b for b in dict.fromkeys(view.config.layer_backends()) if b in SWAPPABLE]
    for backend in present:
        if backend != override.backend:
            view.replace_attention(backend, override.backend)
    if override.backend == LSH:
        view.set_attention_options(LSH, num_hashes=override.num_hashes, seed=hash_seed)
    return view


def run_one(
    spec: RunSpec,
    *,
    device: str = "cpu",
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> RunOutcome:
    """Train one model from its seed (its evaluation set says when to stop), then score it and
    every override on the held-out test set, and the trained model on each evaluation split."""
    data = spec.preset.task.build(spec.seed)
    if clash := sorted({e.label for e in spec.evals} & set(data.splits)):
        raise ConfigError(
            f"evaluation split(s) {', '.join(clash)} of task {spec.preset.task.name!r} share a "
            "label with an evaluation override; rename the split"
        )
    model = build_model(spec, device)
    log.info("training %s", spec.describe())
    result = train(model, data, spec.preset.train, on_step=on_step)
    batch_size = spec.preset.train.eval_batch_size
    test = evaluate(model, data.test_set, batch_size=batch_size)
    evals = {}
    for override in spec.evals:
        view = with_attention(model, override, spec.eval_hash_seed())
        evals[override.label] = evaluate(view, data.test_set, batch_size=batch_size)
    for label, split in data.splits.items():
        evals[label] = evaluate(model, split, batch_size=batch_size)
    return RunOutcome(spec=spec, result=result, test=test, evals=evals)


def train_job(
    spec: RunSpec,
    *,
    device: str = "cpu",
    threads: int | None = None,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> RunOutcome:
    """run_one in the process an executor puts it in (the driver or a Ray worker), with `threads`
    torch threads there when given."""
    if threads:
        torch.set_num_threads(threads)
    return run_one(spec, device=device, on_step=on_step)


def identity(preset: TaskPreset, label: str, seed: int) -> dict[str, Any]:
    """The tidy identity columns of one run."""
    return {
        "task": preset.task.name,
        "preset": preset.name,
        "backend": label,
        "length": preset.task.seq_len,
        "seed": seed,
    }


def trained_as_defined(stored: Mapping[str, Any], preset: TaskPreset) -> bool:
    """Whether a stored run's spec (`RunSpec.key()`) is what `preset`, as defined now, trains
    for the same variant (`same_definition`): False for a run stored before the preset was
    edited."""
    model = stored.get("model") or {}
    variant = TrainVariant(
        label=str(stored.get("variant", "")),
        attn_layers=tuple(model.get("attn_layers") or ()),
        num_hashes=model.get("num_hashes"),
    )
    spec = RunSpec(preset=preset, variant=variant, seed=int(stored.get("seed", 0)), evals=())
    return same_definition(stored, spec.key())


def skipped_key(preset: TaskPreset, label: str, seed: int) -> dict[str, Any]:
    """Identity of a grid entry that did not run (no model config could be built for it)."""
    return {**preset.to_dict(), "variant": label, "seed": seed}


def outcome_rows(outcome: RunOutcome) -> list[dict[str, Any]]:
    """Tidy rows (task, preset, backend, length, seed, metric, value, eval) of one finished run:
    accuracy and loss as trained are the held-out test set's; STOP_ACCURACY, the evaluation
    set's, is what a choice between runs reads (choosing by the test set would bias it again)."""
    spec, result = outcome.spec, outcome.result
    base = identity(spec.preset, spec.variant.label, spec.seed)
    target = spec.preset.train.target_accuracy
    metrics: list[tuple[str, float | None, str]] = [
        ("accuracy", outcome.test.accuracy, TRAINED),
        ("loss", outcome.test.loss, TRAINED),
        (STOP_ACCURACY, result.final_accuracy, TRAINED),
        ("steps", float(result.steps), TRAINED),
        (f"steps_to_{round(target * 100)}", _maybe(result.steps_to_target), TRAINED),
        ("wall_time_s", result.wall_time_s, TRAINED),
    ]
    if (baseline := spec.preset.task.baseline_accuracy()) is not None:
        metrics.append(("baseline_accuracy", baseline, TRAINED))
    for label, ev in outcome.evals.items():
        metrics += [("accuracy", ev.accuracy, label), ("loss", ev.loss, label)]
    return [{**base, "metric": m, "value": v, "eval": e} for m, v, e in metrics]


def _maybe(value: int | None) -> float | None:
    return None if value is None else float(value)


def _unavailable(backend: str, device: str) -> str | None:
    reason = get_backend(backend).unavailable_reason(device)
    return f"backend {backend!r} unavailable: {reason}" if reason else None


def _unsupported(backend: str, case: RunTarget) -> str | None:
    reason = get_backend(backend).unsupported(case)
    return f"backend {backend!r} unavailable: {reason}" if reason else None


def _check_available(backend: str, device: str) -> None:
    if reason := _unavailable(backend, device):
        raise ConfigError(f"evaluation overrides need {backend!r}, but {reason}")
