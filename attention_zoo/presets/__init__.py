"""Sweep presets: TOML files with a [grid] (sweep axes) and a [measure] (how to measure) table.

Built-in presets live next to this file (`quick.toml`, ...); any path to a .toml file works too.

    description = "what it is for"
    [grid]                       # fields of attention_zoo.sweep.SweepGrid
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
    reference = "hf"             # the backend (or peer family) the comparison table divides by
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..declarative import check_keys, checked_dataclass, parse_toml, table
from ..errors import ConfigError, did_you_mean
from ..measure.labels import DEFAULT_REFERENCE
from ..measure.runner import MeasureSettings
from ..sweep import SweepGrid

TOP_KEYS = ("description", "grid", "measure")
PRESET_ONLY_MEASURE_KEYS = ("reference",)


@dataclass(frozen=True, kw_only=True)
class SweepPreset:
    """A loaded sweep preset: where it came from, its grid and measurement settings."""

    name: str
    source: str
    description: str
    grid: SweepGrid
    settings: MeasureSettings
    reference: str = DEFAULT_REFERENCE  # backend the comparison table is relative to


def builtin_presets() -> list[str]:
    """Names of the presets shipped with the package."""
    return sorted(
        p.name[:-5] for p in resources.files(__name__).iterdir() if p.name.endswith(".toml")
    )


def load_sweep_preset(name_or_path: str | Path) -> SweepPreset:
    """Load a built-in preset by name or a TOML file by path; ConfigError says what is wrong."""
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        if path.is_dir():
            raise ConfigError(
                f"preset {path} is a folder; a preset is a built-in name "
                f"({', '.join(builtin_presets())}) or a .toml file"
            )
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
                + did_you_mean(str(name_or_path), builtin_presets())
            )
        text, source, name = (
            resource.read_text(),
            f"built-in preset {name_or_path}",
            str(name_or_path),
        )
    return parse_sweep_preset(text, name=name, source=source)


def parse_sweep_preset(text: str, *, name: str = "preset", source: str = "<string>") -> SweepPreset:
    data = parse_toml(text, source=source)
    check_keys(data, TOP_KEYS, where=source, noun="top-level key")
    grid = checked_dataclass(
        SweepGrid, table(data, "grid", where=source), where=f"{source} [grid]", tuples=True
    )
    measure = table(data, "measure", where=source)
    reference = measure.pop("reference", DEFAULT_REFERENCE)
    check_keys(
        measure,
        [*MeasureSettings.__dataclass_fields__, *PRESET_ONLY_MEASURE_KEYS],
        where=f"{source} [measure]",
    )
    settings = checked_dataclass(MeasureSettings, measure, where=f"{source} [measure]", tuples=True)
    return SweepPreset(
        name=name,
        source=source,
        description=str(data.get("description", "")),
        grid=grid,
        settings=settings,
        reference=reference,
    )


__all__ = ["SweepPreset", "builtin_presets", "load_sweep_preset", "parse_sweep_preset"]
