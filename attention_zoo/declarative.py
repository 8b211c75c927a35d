"""User data (TOML tables, dicts, keyword options) into config dataclasses, with one set of errors:
an unknown key names the accepted ones (and the closest), a missing one is named.

Every place that turns user data into a config uses this: backend options, ReformerConfig, bench
cases, task configs, sweep presets and task suites.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import ConfigError, ZooError, did_you_mean

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

T = TypeVar("T")


def field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def required_fields(cls: type) -> list[str]:
    """The fields of dataclass `cls` without a default."""
    return [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]


def check_keys(
    keys: Iterable[str],
    accepted: Iterable[str],
    *,
    where: str,
    noun: str = "key",
    error: type[ZooError] = ConfigError,
) -> None:
    """Raise `error` naming every key not in `accepted`, what is accepted, and the closest match:
    "<where> does not take <noun>(s) 'x'; it takes: a, b; did you mean 'a'?"."""
    accepted = list(accepted)
    unknown = sorted(set(keys) - set(accepted), key=str)
    if unknown:
        raise error(
            f"{where} does not take {noun}(s) {', '.join(map(repr, unknown))}; "
            f"it takes: {', '.join(accepted) or f'(no {noun}s)'}"
            + "".join(did_you_mean(k, accepted) for k in unknown)
        )


def checked_dataclass(
    cls: type[T],
    data: Mapping[str, Any],
    *,
    where: str,
    noun: str = "key",
    error: type[ZooError] = ConfigError,
    tuples: bool = False,
) -> T:
    """`cls(**data)` after checking for unknown keys (raised as `error`) and missing required ones
    (ConfigError). A value the dataclass refuses becomes a ConfigError prefixed with `where`.
    tuples: a list, or a single value, given for a tuple-typed field becomes a tuple (TOML axes)."""
    check_keys(data, field_names(cls), where=where, noun=noun, error=error)
    missing = [name for name in required_fields(cls) if name not in data]
    if missing:
        raise ConfigError(f"{where} needs {noun}(s) {', '.join(missing)}")
    values = dict(data)
    if tuples:
        for f in dataclasses.fields(cls):
            if f.name in values and str(f.type).startswith("tuple"):
                value = values[f.name]
                values[f.name] = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    try:
        return cls(**values)
    except ZooError as err:
        if not isinstance(err, ConfigError):
            raise  # already says what is wrong and what would work
        raise ConfigError(f"{where}: {err}") from None
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}: {err}") from None


def parse_toml(text: str, *, source: str) -> dict[str, Any]:
    """TOML text -> dict; ConfigError names `source` and the syntax error."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{source} is not valid TOML: {err}") from None


def load_toml(path: str | Path | Traversable) -> dict[str, Any]:
    """A TOML file (a path, or package data from importlib.resources) -> dict; ConfigError when it
    is missing or not valid TOML."""
    path = Path(path) if isinstance(path, str) else path
    if not path.is_file():
        raise ConfigError(f"{path} does not exist")
    return parse_toml(path.read_text(), source=str(path))


def table(data: Mapping[str, Any], key: str, *, where: str) -> dict[str, Any]:
    """`data[key]` as a dict ({} when absent); ConfigError when it is not a table."""
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: [{key}] must be a table, got {value!r}")
    return dict(value)
