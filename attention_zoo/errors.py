"""Exceptions with messages that say what went wrong and what would work."""

from __future__ import annotations

from collections.abc import Iterable


class ZooError(Exception):
    """Base class of every error attention-zoo raises on purpose."""


class UnknownNameError(ZooError, ValueError):
    """A name that no registry entry carries."""

    def __init__(self, kind: str, name: object, known: Iterable[str]) -> None:
        known = sorted(known)
        super().__init__(f"unknown {kind} {name!r}; known {kind}s: {', '.join(known) or '(none)'}")
        self.kind, self.name, self.known = kind, name, known


class OptionError(ZooError, TypeError):
    """An option a component does not take, or an option value it cannot use."""


class UnavailableError(ZooError, RuntimeError):
    """A registered component that cannot run here: a missing dependency or device."""


class ShapeError(ZooError, ValueError):
    """Tensors whose rank or shapes do not fit the contract."""


class ConfigError(ZooError, ValueError):
    """A configuration whose values contradict each other."""
