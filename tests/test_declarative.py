"""The one loader of declarative config: unknown and missing keys, tuples from TOML, TOML errors."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from attention_zoo.declarative import checked_dataclass, load_toml, parse_toml
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
