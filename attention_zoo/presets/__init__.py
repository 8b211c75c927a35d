"""Sweep presets: TOML files with a [grid] (sweep axes) and a [measure] (how to measure) table.

Built-in presets live next to this file (`quick.toml`, ...); any path to a .toml file works too.

    description = "what it is for"
    [grid]                       # fields of attention_zoo.sweep.Grid
    target = "block"             # attention | block | model
    backends = []                # empty: every registered backend
    seq_lens = [256, 1024]
    modes = ["forward", "forward+backward"]
    [grid.options.lsh]           # backend options; a list is an axis
    num_hashes = 4
    [[grid.models]]              # target "model": ReformerConfig fields per variant
    label = "crime-and-punishment"
    [measure]                    # fields of attention_zoo.measure.runner.MeasureSettings
    time_budget_s = 0.2
    threads = 2
    reference = "full"           # the backend the comparison table divides by
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..measure.runner import MeasureSettings
from ..sweep import Grid

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TOP_KEYS = {"description", "grid", "measure"}
PRESET_ONLY_MEASURE_KEYS = {"reference"}
_TUPLE_FIELDS = {
    "backends",
    "seq_lens",
    "batches",
    "modes",
    "dtypes",
    "causal",
    "devices",
    "models",
}


@dataclass(frozen=True, kw_only=True)
class Preset:
    """A loaded preset: where it came from, its grid and measurement settings."""

    name: str
    source: str
    description: str
    grid: Grid
    settings: MeasureSettings
    reference: str | None = None  # backend the comparison table is relative to


def builtin_presets() -> list[str]:
    """Names of the presets shipped with the package."""
    return sorted(
        p.name[:-5] for p in resources.files(__name__).iterdir() if p.name.endswith(".toml")
    )


def load_preset(name_or_path: str | Path) -> Preset:
    """Load a built-in preset by name or a TOML file by path; ConfigError says what is wrong."""
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise ConfigError(
                f"preset file {path} does not exist; "
                f"built-in presets: {', '.join(builtin_presets())}"
            )
        text, source, name = path.read_text(), str(path), path.stem
    else:
        resource = resources.files(__name__) / f"{name_or_path}.toml"
        if not resource.is_file():
            raise ConfigError(
                f"unknown preset {str(name_or_path)!r}; "
                f"built-in presets: {', '.join(builtin_presets())} "
                f"(or give a path to a .toml file)"
            )
        text, source, name = (
            resource.read_text(),
            f"built-in preset {name_or_path}",
            str(name_or_path),
        )
    return parse_preset(text, name=name, source=source)


def parse_preset(text: str, *, name: str = "preset", source: str = "<string>") -> Preset:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{source} is not valid TOML: {err}") from None
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        raise ConfigError(
            f"{source}: unknown top-level key(s) {unknown}; "
            f"a preset has: {', '.join(sorted(TOP_KEYS))}"
        )
    grid = _grid(data.get("grid", {}), source)
    measure = dict(data.get("measure", {}))
    if not isinstance(measure, dict):
        raise ConfigError(f"{source}: [measure] must be a table")
    reference = measure.pop("reference", None)
    settings = _dataclass(
        MeasureSettings, measure, f"{source} [measure]", extra=PRESET_ONLY_MEASURE_KEYS
    )
    return Preset(
        name=name,
        source=source,
        description=str(data.get("description", "")),
        grid=grid,
        settings=settings,
        reference=reference,
    )


def _grid(data: Any, source: str) -> Grid:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: [grid] must be a table")
    data = dict(data)
    for key in _TUPLE_FIELDS & set(data):
        value = data[key]
        data[key] = tuple(value) if isinstance(value, list) else (value,)
    return _dataclass(Grid, data, f"{source} [grid]")


def _dataclass(cls: type, data: dict[str, Any], where: str, extra: set[str] = frozenset()) -> Any:
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - fields)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {unknown}; accepted: {', '.join(sorted(fields | set(extra)))}"
        )
    if "metrics" in data and isinstance(data["metrics"], list):
        data["metrics"] = tuple(data["metrics"])
    try:
        return cls(**data)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}: {err}") from None


__all__ = ["Preset", "builtin_presets", "load_preset", "parse_preset"]
