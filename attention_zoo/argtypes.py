"""argparse types for numbers, lists and sizes, shared by the `zoo` subcommands and the
executors' flags: each raises ArgumentTypeError, which the parser turns into one line saying what
would work."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable

from .errors import did_you_mean
from .measure.units import parse_bytes


def integer(minimum: int = 1, maximum: int | None = None) -> Callable[[str], int]:
    """An int >= minimum (and <= maximum), e.g. `type=integer(1)` for --repeats."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            within = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
            raise argparse.ArgumentTypeError(f"must be an integer {within}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def number(*, above: float | None = None, minimum: float | None = None) -> Callable[[str], float]:
    """A float > above (or >= minimum), e.g. `type=number(above=0)` for --timeout."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        if above is not None and value <= above:
            raise argparse.ArgumentTypeError(f"must be a number > {above:g}, got {value:g}")
        if minimum is not None and value < minimum:
            raise argparse.ArgumentTypeError(f"must be a number >= {minimum:g}, got {value:g}")
        return value

    parse.__name__ = "number"
    return parse


def integers(
    minimum: int = 1, *, maximum: int | None = None, allow_empty: bool = False
) -> Callable[[str], list[int]]:
    """A comma list of ints >= minimum (and <= maximum), e.g. `--lengths 1024,4096`."""
    one = integer(minimum, maximum)

    def parse(text: str) -> list[int]:
        values = [one(x.strip()) for x in text.split(",") if x.strip()]
        if not values and not allow_empty:
            raise argparse.ArgumentTypeError(f"expected a comma list of integers, got {text!r}")
        return values

    parse.__name__ = "integers"
    return parse


def names(text: str) -> list[str]:
    """A comma list of names; empty items are dropped."""
    values = [x.strip() for x in text.split(",") if x.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected a comma list of names, got {text!r}")
    return values


def size(text: str) -> int:
    """A memory size > 0: 8GiB, 8GB, 512MiB, or a bare number of GiB."""
    try:
        value = parse_bytes(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a size > 0 such as 8GiB, got {text!r}")
    return value


def choices(allowed: Iterable[str], what: str) -> Callable[[str], list[str]]:
    """A comma list whose items are each one of `allowed` (did-you-mean for a misspelled one)."""
    options = list(allowed)

    def parse(text: str) -> list[str]:
        values = names(text)
        for value in values:
            if value not in options:
                raise argparse.ArgumentTypeError(
                    f"unknown {what} {value!r}; {what}s: {', '.join(options)}"
                    + did_you_mean(value, options)
                )
        return values

    parse.__name__ = what
    return parse
