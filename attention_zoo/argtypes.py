"""argparse types for numbers, lists and sizes, shared by the `zoo` subcommands and the
executors' flags: each raises ArgumentTypeError, which the parser turns into one line saying what
would work."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable

from .declarative import MAX_COUNT
from .errors import did_you_mean, plural
from .measure.units import parse_bytes


def integer(minimum: int = 1, maximum: int = MAX_COUNT) -> Callable[[str], int]:
    """An int from minimum to maximum, e.g. `type=integer(1)` for --repeats; the default maximum,
    MAX_COUNT (2**31 - 1), is the most tokens the kernels can index (declarative.MAX_COUNT)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum or value > maximum:
            below = value < minimum and maximum == MAX_COUNT  # the bound no one asks about
            within = f">= {minimum}" if below else f"from {minimum} to {maximum}"
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
    minimum: int = 1, *, maximum: int = MAX_COUNT, allow_empty: bool = False
) -> Callable[[str], list[int]]:
    """A comma list of ints from minimum to maximum, e.g. `--lengths 1024,4096`; allow_empty: ''
    is the empty list."""
    one = integer(minimum, maximum)

    def parse(text: str) -> list[int]:
        if not text.strip():
            if allow_empty:
                return []
            raise argparse.ArgumentTypeError(f"expected a comma list of integers, got {text!r}")
        return [one(x) for x in comma_items(text, "integers", example="1024,4096")]

    parse.__name__ = "integers"
    return parse


def names(text: str) -> list[str]:
    """A comma list of names, none of them empty."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a comma list of names, got {text!r}")
    return comma_items(text, "names", example="full,sdpa")


def comma_items(text: str, what: str, *, example: str) -> list[str]:
    """The stripped items of a comma list; an empty one (`64,,128`, a trailing comma) is refused,
    never dropped."""
    items = [x.strip() for x in text.split(",")]
    if "" in items:
        raise argparse.ArgumentTypeError(
            f"{text!r} has an empty item; give {what} separated by single commas, e.g. {example}"
        )
    return items


def size(text: str) -> int:
    """A memory size > 0: 8GiB, 8GB, 512MiB, or a bare number of GiB."""
    if text.strip().startswith("-"):
        raise argparse.ArgumentTypeError(f"must be a size > 0 such as 8GiB, got {text!r}")
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
                    f"unknown {what} {value!r}; {plural(what)}: {', '.join(options)}"
                    + did_you_mean(value, options)
                )
        return values

    parse.__name__ = what
    return parse
