"""Exceptions with messages that say what went wrong and what would work."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(name: object, known: Iterable[str], *, quote: bool = True) -> str:
    """'; did you mean 'lsh'?' when `known` holds a close match of `name`, else ''."""
    if not isinstance(name, str):
        return ""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    if not close:
        return ""
    return f"; did you mean {close[0]!r}?" if quote else f"; did you mean {close[0]}?"


def plural(noun: str) -> str:
    """'backend' -> 'backends', 'peer family' -> 'peer families' (the last word's plural)."""
    if len(noun) > 1 and noun.endswith("y") and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    if noun.endswith(("s", "x", "sh", "ch")):
        return noun + "es"
    return noun + "s"


class ZooError(Exception):
    """Base class of every error attention-zoo raises on purpose."""


class UnknownNameError(ZooError, ValueError):
    """A name that no registry entry carries."""

    def __init__(self, kind: str, name: object, known: Iterable[str]) -> None:
        known = sorted(known)
        super().__init__(
            f"unknown {kind} {name!r}; known {plural(kind)}: {', '.join(known) or '(none)'}"
            + did_you_mean(name, known)
        )
        self.kind, self.name, self.known = kind, name, known


class OptionError(ZooError, TypeError):
    """An option a component does not take, or an option value it cannot use."""


class UnavailableError(ZooError, RuntimeError):
    """A registered component that cannot run here: a missing dependency or device."""


class ShapeError(ZooError, ValueError):
    """Tensors whose rank, shapes or dtypes do not fit the contract."""


class InputError(ZooError, ValueError):
    """Input values outside what a component accepts, e.g. a token id >= vocab_size."""


class ConfigError(ZooError, ValueError):
    """A configuration whose values contradict each other."""


class UnknownPresetError(ConfigError):
    """A task suite without the preset asked for (the message lists the presets it has)."""


class UsageError(ZooError, ValueError):
    """Command-line input that is malformed, contradicts itself or would do nothing."""

    def __init__(self, message: str, *, prog: str | None = None) -> None:
        super().__init__(message)
        self.prog = prog  # the (sub)command whose usage it is, e.g. "zoo bench"


class PluginError(ZooError, ImportError):
    """A plugin module that was asked for by name and failed to import."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C in a long command after it saved what it finished; the message says how to go on."""
