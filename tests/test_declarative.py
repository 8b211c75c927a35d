"""The one loader of declarative config: unknown and missing keys, tuples from TOML, TOML errors."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from attention_zoo.declarative import check_field_types, checked_dataclass, load_toml, parse_toml
from attention_zoo.errors import ConfigError, OptionError


@dataclass(frozen=True, kw_only=True)
class _Settings:
    seq_lens: tuple[int, ...]
    budget_s: float = 1.0

    def __post_init__(self) -> None:
        if self.budget_s <= 0:
            raise ValueError(f"budget_s must be > 0, got {self.budget_s}")


def test_unknown_key_names_the_accepted_ones_and_the_closest() -> None:
    with pytest.raises(
        OptionError,
        match=r"^x.toml \[s\] does not take key\(s\) 'budget', 'zzz'; it takes: seq_lens, "
        r"budget_s; did you mean 'budget_s'\?$",
    ):
        checked_dataclass(
            _Settings,
            {"seq_lens": [1], "budget": 2, "zzz": 0},
            where="x.toml [s]",
            error=OptionError,
        )


def test_missing_required_key_and_refused_value_say_where() -> None:
    with pytest.raises(ConfigError, match=r"^\[s\] needs field\(s\) seq_lens$"):
        checked_dataclass(_Settings, {}, where="[s]", noun="field")
    with pytest.raises(ConfigError, match=r"^\[s\]: budget_s must be > 0, got -1$"):
        checked_dataclass(_Settings, {"seq_lens": (1,), "budget_s": -1}, where="[s]")


def test_lists_and_single_values_become_tuples_only_when_asked() -> None:
    assert checked_dataclass(_Settings, {"seq_lens": [1, 2]}, where="-", tuples=True).seq_lens == (
        1,
        2,
    )
    assert checked_dataclass(_Settings, {"seq_lens": 7}, where="-", tuples=True).seq_lens == (7,)
    assert checked_dataclass(_Settings, {"seq_lens": [1]}, where="-").seq_lens == [1]


def test_toml_errors_name_the_source(tmp_path: Path) -> None:
    assert parse_toml("a = 1\n[t]\nb = [2]\n", source="s") == {"a": 1, "t": {"b": [2]}}
    with pytest.raises(ConfigError, match=r"^my.toml is not valid TOML: "):
        parse_toml("a = [1, 2\n", source="my.toml")
    with pytest.raises(ConfigError, match="does not exist"):
        load_toml(tmp_path / "none.toml")


@dataclass(frozen=True, kw_only=True)
class _Grid:
    causal: tuple[bool, ...] = (True,)
    threads: int | None = None
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    models: tuple[dict[str, Any], ...] = ()

    def __post_init__(self) -> None:
        check_field_types(self)


def test_a_config_built_in_python_checks_its_field_types_as_a_file_would() -> None:
    """One check of values against annotations, tables included; a config built from Python
    says the same as one built from a preset (which prefixes where)."""
    assert _Grid(causal=[False], threads=2, options={"lsh": {"n": [1, 2]}}, models=({"a": 1},))
    for bad, message in [
        (dict(causal=("false",)), "causal must be a list of true/false values, got ('false',)"),
        (dict(threads="2"), "threads must be an int or None, got '2'"),
        (dict(threads=True), "threads must be an int or None, got True"),
        (dict(options={"lsh": 2}), "options must be a table of tables, got {'lsh': 2}"),
        (dict(options={3: {}}), "options must be a table of tables, got {3: {}}"),
        (dict(models=([1],)), "models must be a list of tables, got ([1],)"),
    ]:
        with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
            _Grid(**bad)
    with pytest.raises(ConfigError, match=r"^p.toml \[grid\]: threads must be an int or None"):
        checked_dataclass(_Grid, {"threads": 1.5}, where="p.toml [grid]")
