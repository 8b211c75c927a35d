"""Declarative task suites (TOML): presets and grids -> run plans. The built-in suites ship in the
package (`attention_zoo/tasks/suites/`); a user's own, in `./tasks` or $ZOO_TASKS_DIR, come first.

A suite file names one task and presets (`smoke`, `cpu`, `paper`, ...). Each preset has four
tables: `task` (task config fields), `model` (ReformerConfig fields, HF names), `train`
(TrainConfig fields) and `grid` (what to train and how to evaluate). A top-level `[defaults]`
table with the same four tables is merged under every preset.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import ReformerConfig
from ..declarative import check_field_types, check_keys, checked_dataclass, field_names, load_toml
from ..errors import ConfigError, UnknownPresetError, did_you_mean
from .base import TASKS, TaskConfig, get_task, make_task
from .trainer import TrainConfig

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

SUITES_ENV = "ZOO_TASKS_DIR"  # folders of user suites, separated like PATH (os.pathsep)
BUILTIN_SUITES = "suites"  # package data: attention_zoo/tasks/suites/<task>.toml

TOP_KEYS = ("task", "defaults", "presets")
SECTIONS = ("task", "model", "train", "grid")
# Fields a preset must give (after merging [defaults]); everything else has a default.
REQUIRED = {
    "task": ("seq_len", "vocab_size"),
    "model": ("hidden_size", "num_attention_heads", "num_hidden_layers", "feed_forward_size"),
    "train": ("max_steps", "target_accuracy"),
    "grid": ("backends", "seeds"),
}
# Fields the engine sets itself from the task and the grid.
ENGINE_MODEL_FIELDS = ("attn_layers", "vocab_size", "max_position_embeddings", "is_decoder")


MAX_SEED = 2**32 - 1  # run seeds are 0..MAX_SEED (each seeds its streams: tasks/base.py)


@dataclass(frozen=True, kw_only=True)
class TaskGrid:
    """What to train (attention mixes x hash counts x seeds) and how to evaluate each model."""

    backends: tuple[str, ...]  # registry names; "a+b" = attn_layers ["a", "b"] cycled over layers
    seeds: tuple[int, ...]
    train_hashes: tuple[int, ...] = (1,)  # num_hashes while training, for mixes containing "lsh"
    eval_hashes: tuple[int, ...] = ()  # num_hashes at evaluation for shared-QK models (Table 2)
    eval_full: bool = True  # also evaluate shared-QK models with shared-QK full attention

    def __post_init__(self) -> None:
        check_field_types(self)
        bad = [s for s in self.seeds if not (isinstance(s, int) and 0 <= s <= MAX_SEED)]
        if bad:
            raise ConfigError(f"grid seeds must be integers from 0 to {MAX_SEED}, got {bad[0]!r}")


@dataclass(frozen=True, kw_only=True)
class TaskPreset:
    """One fully specified preset of a task suite."""

    suite: str  # where it came from (file path), for messages and stored configs
    name: str
    description: str
    task: TaskConfig
    model: dict[str, Any]  # ReformerConfig fields (without the engine-set ones)
    train: TrainConfig
    grid: TaskGrid

    def to_dict(self) -> dict[str, Any]:
        """What defines the preset's runs (not where its file lies, so a moved checkout resumes)."""
        return {
            "preset": self.name,
            "task": self.task.to_dict(),
            "model": dict(self.model),
            "train": {f.name: getattr(self.train, f.name) for f in fields(self.train)},
        }


def suite_dirs() -> list[Path]:
    """Folders of user suites, searched in this order before the built-in ones: each folder of
    $ZOO_TASKS_DIR, then ./tasks."""
    dirs = [Path(d) for d in os.environ.get(SUITES_ENV, "").split(os.pathsep) if d]
    dirs.append(Path.cwd() / "tasks")
    return list(dict.fromkeys(dirs))


def builtin_suite(task: str) -> Traversable | None:
    """The suite shipped with the package for `task` (read through importlib.resources), if any."""
    resource = resources.files(__package__) / BUILTIN_SUITES / f"{task}.toml"
    return resource if resource.is_file() else None


def find_suite(spec: str) -> Path | Traversable:
    """A suite file path, or a task name looked up as `<name>.toml` in `suite_dirs()`, then among
    the built-in suites (a user's file of the same name wins: it is how a built-in is edited)."""
    path = Path(spec)
    if path.suffix == ".toml" or path.is_file():  # a folder named like a task is not a suite
        if not path.is_file():
            raise ConfigError(
                f"suite file {spec!r} does not exist; give an existing .toml path, or a task "
                f"name: {', '.join(TASKS.names())}"
            )
        return path
    get_task(spec)  # unknown task name -> UnknownNameError listing the known tasks
    for d in suite_dirs():
        candidate = d / f"{spec}.toml"
        if candidate.is_file():
            return candidate
    if (builtin := builtin_suite(spec)) is not None:
        return builtin
    raise ConfigError(
        f"task {spec!r} has no suite file; looked for {spec}.toml in: "
        f"{', '.join(map(str, suite_dirs()))} and the built-in suites "
        f"(set {SUITES_ENV} or pass a .toml path)"
    )


def load_suite(spec: str) -> tuple[Path | Traversable, dict[str, Any]]:
    path = find_suite(spec)
    data = load_toml(path)
    check_keys(data, TOP_KEYS, where=str(path), noun="top-level key")
    if not isinstance(data.get("task"), str):
        raise ConfigError(f'{path}: needs a top-level `task = "<name>"` line')
    if not isinstance(data.get("presets"), dict) or not data["presets"]:
        raise ConfigError(f"{path}: needs at least one [presets.<name>] table")
    return path, data


def preset_names(spec: str) -> list[str]:
    return list(load_suite(spec)[1]["presets"])


def load_task_preset(spec: str, preset: str) -> TaskPreset:
    """Load, merge and validate one preset; every missing field is named in one error."""
    path, data = load_suite(spec)
    presets = data["presets"]
    if preset not in presets:
        raise UnknownPresetError(
            f"{path}: no preset {preset!r}; presets: {', '.join(presets)}"
            + did_you_mean(preset, presets)
        )
    raw = _merge(data.get("defaults", {}), presets[preset])
    where = f"{path} preset {preset!r}"
    check_keys(raw, (*SECTIONS, "description"), where=where, noun="table")
    missing = [
        f"{section}.{key}"
        for section, keys in REQUIRED.items()
        for key in keys
        if key not in raw.get(section, {})
    ]
    if missing:
        raise ConfigError(f"{where} is missing field(s): {', '.join(missing)}")
    model = dict(raw["model"])
    check_keys(model, field_names(ReformerConfig), where=f"{where}: model", noun="field")
    engine_set = sorted(set(model) & set(ENGINE_MODEL_FIELDS))
    if engine_set:
        raise ConfigError(
            f"{where}: model.{', model.'.join(engine_set)} are set by the engine "
            "(attention from grid.backends, vocabulary and length from the task); remove them"
        )
    task = make_task(data["task"], **raw["task"])
    train = checked_dataclass(TrainConfig, raw["train"], where=f"{where}: train", noun="field")
    grid = checked_dataclass(
        TaskGrid, raw["grid"], where=f"{where}: grid", noun="field", tuples=True
    )
    return TaskPreset(
        suite=str(path),
        name=preset,
        description=str(raw.get("description", "")),
        task=task,
        model=model,
        train=train,
        grid=grid,
    )


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out
