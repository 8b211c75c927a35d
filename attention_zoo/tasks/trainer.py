"""The fixed training recipe every task run uses, periodic evaluation and early stopping.

Recipe (calibrated with the duplication task's cpu preset): Adam, learning rate 1e-3, linear
warm-up over 100 steps then constant, batch 32, fresh batches every step. The trainer counts
steps, not seconds, so results compare across machines; wall time is recorded only as information.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..declarative import check_field_types
from ..errors import ConfigError
from .base import IGNORE_INDEX, Batch, TaskData

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Optimiser recipe, step budget and stopping rule of one training run."""

    batch_size: int = 32
    learning_rate: float = 1e-3
    warmup_steps: int = 100  # linear warm-up from lr/warmup_steps to lr, then constant
    max_steps: int = 2000  # step cap
    eval_every: int = 50  # steps between evaluations on the fixed eval set
    eval_batch_size: int = 128  # sequences per forward pass when evaluating
    target_accuracy: float = 0.95  # steps-to-target is the first evaluated step at or above this
    steps_after_target: int = 0  # keep training this many steps after reaching it, then stop
    log_every: int = 10  # steps between points of the recorded training-loss curve
    grad_clip: float | None = None  # max gradient norm; None: no clipping

    def __post_init__(self) -> None:
        check_field_types(self)
        bad = [
            name
            for name in ("batch_size", "max_steps", "eval_every", "eval_batch_size", "log_every")
            if getattr(self, name) < 1
        ]
        if bad or self.warmup_steps < 0 or self.steps_after_target < 0 or self.learning_rate <= 0:
            raise ConfigError(
                "train config: batch_size, max_steps, eval_every, eval_batch_size, log_every "
                "must be >= 1, warmup_steps and steps_after_target >= 0, learning_rate > 0; "
                f"got {self}"
            )


@dataclass(frozen=True)
class EvalResult:
    """Accuracy and mean cross-entropy over the scored positions (or sequences) of an eval set."""

    accuracy: float
    loss: float
    scored: int  # number of scored tokens (sequences, for sequence classification)


@dataclass(frozen=True, kw_only=True)
class TrainResult:
    """What one training run produced (the model itself is returned beside it)."""

    steps: int  # optimiser steps taken
    steps_to_target: int | None  # first evaluated step with accuracy >= target; None if never
    final_accuracy: float  # eval-set accuracy of the returned model (it chose when to stop)
    final_loss: float  # eval-set loss of the returned model
    stopped: str  # "target" (reached, plus steps_after_target) or "max_steps"
    wall_time_s: float  # information only: the machine may be shared
    loss_curve: tuple[tuple[int, float], ...] = field(default=())  # (step, mean training loss)
    eval_curve: tuple[tuple[int, float], ...] = field(default=())  # (step, eval accuracy)

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "steps_to_target": self.steps_to_target,
            "final_accuracy": self.final_accuracy,
            "final_loss": self.final_loss,
            "stopped": self.stopped,
            "wall_time_s": self.wall_time_s,
            "loss_curve": [list(p) for p in self.loss_curve],
            "eval_curve": [list(p) for p in self.eval_curve],
        }


def logits_of(output: Any) -> Tensor:
    """The logits of a model output (an object with .logits, or the tensor): (b, n, vocab) for a
    language model, (b, classes) for a sequence classifier."""
    return output.logits if hasattr(output, "logits") else output


def scored_loss(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Shifted causal-LM cross-entropy over scored positions: (mean loss, correct, count).

    The prediction for labels[:, i] is read at position i - 1 (Hugging Face convention). Labels
    (b,) are one class per sequence, read from logits (b, classes) (sequence classification).
    """
    if labels.dim() == 1:
        return _scored(logits, labels)
    return _scored(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())


def batch_loss(model: nn.Module, batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
    """scored_loss of `model` on `batch`, its padding masked. A language model with a separate
    output layer (`reformer` + `lm_head`, as ReformerLM) computes logits only at the scored
    positions: the same loss, without a (b, n, vocab) tensor when few positions are scored."""
    kwargs = {} if batch.attention_mask is None else {"attention_mask": batch.attention_mask}
    if batch.labels.dim() == 2 and hasattr(model, "lm_head") and hasattr(model, "reformer"):
        hidden = model.reformer(batch.input_ids, **kwargs).last_hidden_state  # (b, n, 2d)
        target = batch.labels[:, 1:]
        scored = target != IGNORE_INDEX  # predicted at the position before
        return _scored(model.lm_head(hidden[:, :-1][scored]), target[scored])
    return scored_loss(logits_of(model(batch.input_ids, **kwargs)), batch.labels)


def _scored(logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(mean loss, correct, count) of logits (m, classes) against target (m,), IGNORE_INDEX
    where nothing is scored."""
    loss = F.cross_entropy(logits.float(), target, ignore_index=IGNORE_INDEX)
    scored = target != IGNORE_INDEX
    correct = (logits.argmax(-1) == target) & scored
    return loss, correct.sum(), scored.sum()


@torch.no_grad()
def evaluate(model: nn.Module, eval_set: Batch, *, batch_size: int = 128) -> EvalResult:
    """Accuracy and loss of `model` on every scored position of `eval_set` (eval mode, no grad)."""
    was_training = model.training
    model.eval()
    device = _device_of(model)
    total_loss, correct, count = 0.0, 0, 0
    try:
        for part in eval_set.split(batch_size):
            part = part.to(device)
            loss, hits, n = batch_loss(model, part)
            total_loss += float(loss) * int(n)
            correct += int(hits)
            count += int(n)
    finally:
        model.train(was_training)
    if count == 0:
        raise ConfigError("the evaluation set scores no position; check the task's labels")
    return EvalResult(accuracy=correct / count, loss=total_loss / count, scored=count)


def warmup_lambda(warmup_steps: int) -> Callable[[int], float]:
    """LR multiplier: (step+1)/warmup for the first warmup steps, then 1."""
    return lambda step: min(1.0, (step + 1) / warmup_steps) if warmup_steps else 1.0


def train(
    model: nn.Module,
    data: TaskData,
    cfg: TrainConfig,
    *,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> TrainResult:
    """Train `model` on `data` with the fixed recipe until the target (+ steps_after_target) or
    max_steps.

    Evaluates every `eval_every` steps and at the end; `on_step(step, info)` is called after every
    step (a progress bar hooks in here). Seed the model init and LSH rotations beforehand
    (torch.manual_seed) for a reproducible run.
    """
    device = _device_of(model)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.learning_rate)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_lambda(cfg.warmup_steps))
    batches = data.batches(cfg.batch_size)
    loss_curve: list[tuple[int, float]] = []
    eval_curve: list[tuple[int, float]] = []
    steps_to_target: int | None = None
    window: list[float] = []
    last_eval: EvalResult | None = None
    stopped = "max_steps"
    start = time.perf_counter()
    model.train()
    step = 0
    while step < cfg.max_steps:
        batch = next(batches).to(device)
        loss, _, _ = batch_loss(model, batch)
        value = loss.detach().item()
        if not math.isfinite(value):
            raise FloatingPointError(f"training loss became {value} at step {step + 1}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        sched.step()
        step += 1
        window.append(value)
        if step % cfg.log_every == 0:
            loss_curve.append((step, sum(window) / len(window)))
            window.clear()
        info = {"loss": value}
        if step % cfg.eval_every == 0 or step == cfg.max_steps:
            last_eval = evaluate(model, data.eval_set, batch_size=cfg.eval_batch_size)
            eval_curve.append((step, last_eval.accuracy))
            info["accuracy"] = last_eval.accuracy
            log.debug("step %d: loss %.4f, eval accuracy %.4f", step, value, last_eval.accuracy)
            if steps_to_target is None and last_eval.accuracy >= cfg.target_accuracy:
                steps_to_target = step
        if steps_to_target is not None and step >= steps_to_target + cfg.steps_after_target:
            stopped = "target"
            if not eval_curve or eval_curve[-1][0] != step:
                last_eval = evaluate(model, data.eval_set, batch_size=cfg.eval_batch_size)
                eval_curve.append((step, last_eval.accuracy))
                info["accuracy"] = last_eval.accuracy
        if on_step is not None:
            on_step(step, info)
        if stopped != "max_steps":
            break
    if window:
        loss_curve.append((step, sum(window) / len(window)))
    if last_eval is None or eval_curve[-1][0] != step:  # max_steps == 0 cannot happen; be safe
        last_eval = evaluate(model, data.eval_set, batch_size=cfg.eval_batch_size)
        eval_curve.append((step, last_eval.accuracy))
    model.eval()
    return TrainResult(
        steps=step,
        steps_to_target=steps_to_target,
        final_accuracy=last_eval.accuracy,
        final_loss=last_eval.loss,
        stopped=stopped,
        wall_time_s=time.perf_counter() - start,
        loss_curve=tuple(loss_curve),
        eval_curve=tuple(eval_curve),
    )


def _device_of(model: nn.Module) -> torch.device:
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")
