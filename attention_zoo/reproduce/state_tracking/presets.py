"""The runs behind Grazzi et al.'s parity claims: the state-tracking suite's grazzi-<size> preset
(no position embeddings; gated-deltanet with step sizes in (0, 1), gla, linear) and its copy in
which gated-deltanet has negative eigenvalues (step sizes in (0, 2))."""

from __future__ import annotations

import dataclasses

from ...tasks.suite import TaskPreset, load_task_preset

TASK = "state-tracking"
DELTA_RULE = "gated-deltanet"  # the backend trained with and without negative eigenvalues
NEGATIVE = "negative-eigenvalues"  # the copy's name suffix and the claims' word for it


def base_name(size: str) -> str:
    """The suite preset of `size`: every mechanism with eigenvalues in [0, 1]."""
    return f"grazzi-{size}"


def negative_name(size: str) -> str:
    """The stored preset name of the copy with gated-deltanet's negative eigenvalues."""
    return f"{base_name(size)}-{NEGATIVE}"


def parity_presets(size: str) -> list[TaskPreset]:
    """The presets `size` trains: the negative-eigenvalue copy (the reference), then the suite's."""
    base = load_task_preset(TASK, base_name(size))
    options = {**base.model.get("attn_options", {}), DELTA_RULE: {"negative_eigenvalues": True}}
    negative = dataclasses.replace(
        base,
        name=negative_name(size),
        description=f"{base.description}; {DELTA_RULE} with negative eigenvalues",
        model={**base.model, "attn_options": options},
        grid=dataclasses.replace(base.grid, backends=(DELTA_RULE,)),
    )
    return [negative, base]


def scale_text(preset: TaskPreset) -> str:
    """The size a claim was measured at, in one line."""
    task, model, train = preset.task, preset.model, preset.train
    positions = "learned" if model.get("position_embeddings", True) else "no"
    return (
        f"parity trained at {task.seq_len} tokens (prefixes 1-{task.seq_len - 1} scored), tested "
        f"to {max(task.test_lengths)}; {model['num_hidden_layers']} layer(s) d "
        f"{model['hidden_size']}, {model['num_attention_heads']} heads, {positions} position "
        f"embeddings; "
        f"<= {train.max_steps} steps x {train.batch_size} at learning rate "
        f"{train.learning_rate:g}; {task.split_size} sequences per test split"
    )
