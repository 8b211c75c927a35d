"""A small typed name -> item registry, shared by attention backends, residuals, tasks and peers.

Each entry remembers its origin ("built-in", or the plugin or module that registered it), which
`zoo list` shows. Every registry a plugin may add to is listed by `pluggable_registries()`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from .errors import UnknownNameError, ZooError

T = TypeVar("T")


class Registry(Generic[T]):
    """Named items of one kind; duplicate names are refused, unknown names listed in the error."""

    def __init__(self, kind: str, *, pluggable: bool = True) -> None:
        """pluggable: plugins may add to it (their additions get their origin, and are undone when
        the plugin fails)."""
        self.kind = kind
        self._items: dict[str, T] = {}
        self._origins: dict[str, str] = {}
        if pluggable:
            _PLUGGABLE.append(self)

    def add(self, name: str, item: T, *, replace: bool = False, origin: str | None = None) -> T:
        """Register `item`; origin by default "built-in" or "module NAME" (where it is defined)."""
        if not isinstance(name, str) or not name:
            raise ZooError(f"a {self.kind} name must be a non-empty string, got {name!r}")
        if name in self._items and not replace:
            raise ZooError(
                f"{self.kind} {name!r} is already registered; pick another name "
                f"or pass replace=True to override it"
            )
        self._items[name] = item
        self._origins[name] = origin or origin_of(item)
        return item

    def remove(self, name: str) -> T:
        self.get(name)
        self._origins.pop(name, None)
        return self._items.pop(name)

    def origin(self, name: str) -> str:
        """Where the entry came from: "built-in", "--import mod", "plugin 'x' (dist 1.0)", ..."""
        self.get(name)
        return self._origins[name]

    def set_origin(self, name: str, origin: str) -> None:
        self.get(name)
        self._origins[name] = origin

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except (KeyError, TypeError):
            raise UnknownNameError(self.kind, name, self._items) from None

    def names(self) -> list[str]:
        return list(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[T]:
        return iter(list(self._items.values()))

    def __len__(self) -> int:
        return len(self._items)


_PLUGGABLE: list[Registry[Any]] = []  # in creation order


def pluggable_registries() -> list[Registry[Any]]:
    """Every registry plugins may add to, in the order they were created."""
    return list(_PLUGGABLE)


def origin_of(item: object) -> str:
    """The origin of an item: "built-in" for attention-zoo's own code, else "module NAME"."""
    module = getattr(item, "__module__", None) or ""
    return "built-in" if module.split(".")[0] == "attention_zoo" else f"module {module}"
