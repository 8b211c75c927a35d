"""User data (TOML tables, dicts, keyword options) into config dataclasses, with one set of errors:
an unknown key names the accepted ones (and the closest), a missing one is named.

Every place that turns user data into a config uses this: backend options, ReformerConfig, bench
cases, task configs, sweep presets and task suites.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Union

from .errors import ConfigError, ZooError, did_you_mean, plural

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

T = TypeVar("T")

MAX_COUNT = 2**31 - 1
"""The largest count user input may give (a length, context, batch, head count, repeats, threads):
kernels keep positions as int32 (LSH's buckets, rounds' chunks, routed tiles, FlexAttention's
blocks), and torch takes threads as a C int."""


def field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def required_fields(cls: type) -> list[str]:
    """The fields of dataclass `cls` without a default."""
    return [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]


def check_count(value: Any, name: str, *, minimum: int = 1) -> None:
    """ConfigError unless `value` is an int from `minimum` to MAX_COUNT (a bool is no int):
    "num_heads must be an integer >= 1, got 'four'"."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value > MAX_COUNT:
        raise ConfigError(
            f"{name} must be an integer from {minimum} to {MAX_COUNT} (2**31 - 1), got {value!r}"
        )


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
            f"it takes: {', '.join(accepted) or f'(no {plural(noun)})'}"
            + "".join(did_you_mean(k, accepted) for k in unknown)
        )


def check_types(
    cls: type,
    values: Mapping[str, Any],
    *,
    where: str,
    noun: str = "key",
    error: type[ZooError] = ConfigError,
) -> None:
    """Raise `error` for a value that does not fit its field's annotation in dataclass `cls`
    (int, float, bool, str, None, Literal, unions, tuples, lists and dicts of them): "<where> <noun>
    window must be an int, got 'abc'". A bool is no int, an int is a float; annotations this check
    cannot read are left to the dataclass's own checks."""
    misfit = _misfit(cls, values)
    if misfit:
        raise error(f"{where} {noun} {misfit}")


def check_field_types(config: Any) -> None:
    """ConfigError for a field of dataclass instance `config` whose value does not fit its
    annotation, for a config built from Python as from a file: "causal must be a list of
    true/false values, got ('false',)". Call it before any check that computes with the values
    (fields not set by __init__ are the dataclass's own business)."""
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init}
    misfit = _misfit(type(config), values)
    if misfit:
        raise ConfigError(misfit)


def _misfit(cls: type, values: Mapping[str, Any]) -> str | None:
    """The first value that does not fit its field's annotation in dataclass `cls`, said as
    "<name> must be <kind>, got <value>"; None when all fit."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # an annotation naming what its module does not define: not checkable
        return None
    for name, value in values.items():
        expected = hints.get(name)
        if expected is not None and not _fits(value, expected):
            return f"{name} must be {_kind(expected)}, got {value!r}"
    return None


def _fits(value: Any, tp: Any) -> bool:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return True
    if origin in (Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if origin is Literal:
        return value in args
    if origin is dict:
        if not isinstance(value, dict):
            return False
        key, item = args or (Any, Any)
        return all(_fits(k, key) and _fits(v, item) for k, v in value.items())
    if origin in (tuple, list):
        if not isinstance(value, (tuple, list)):
            return False
        if not args:
            return True
        if origin is list or args[-1] is Ellipsis:  # list[X], tuple[X, ...]
            return all(_fits(v, args[0]) for v in value)
        return len(value) == len(args) and all(_fits(v, a) for v, a in zip(value, args))
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(tp, type) and origin is None:
        return isinstance(value, tp)
    return True  # a typing construct this check does not know


def _kind(tp: Any) -> str:
    """How a message names what fits `tp`: an int, a number, a string, ..."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_kind(a) for a in args)
    if origin is Literal:
        return "one of " + ", ".join(map(repr, args))
    if origin in (tuple, list):
        return f"a list of {_plural(args[0])}" if args else "a list"
    if origin is dict:
        return "a table" if not args or args[1] is Any else f"a table of {_plural(args[1])}"
    names = {int: "an int", float: "a number", bool: "true or false", str: "a string"}
    return "None" if tp is type(None) else names.get(tp, getattr(tp, "__name__", str(tp)))


def _plural(tp: Any) -> str:
    """How a message names several values that fit `tp`: ints, strings, tables, ..."""
    if typing.get_origin(tp) is dict:
        return "tables"
    plurals = {int: "ints", float: "numbers", bool: "true/false values", str: "strings"}
    return plurals.get(tp, _kind(tp))


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
