"""A small typed name -> item registry, shared by attention backends, residuals and tasks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

from .errors import UnknownNameError, ZooError

T = TypeVar("T")


class Registry(Generic[T]):
    """Named items of one kind; duplicate names are refused, unknown names listed in the error."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def add(self, name: str, item: T, *, replace: bool = False) -> T:
        if not isinstance(name, str) or not name:
            raise ZooError(f"a {self.kind} name must be a non-empty string, got {name!r}")
        if name in self._items and not replace:
            raise ZooError(
                f"{self.kind} {name!r} is already registered; pick another name "
                f"or pass replace=True to override it"
            )
        self._items[name] = item
        return item

    def remove(self, name: str) -> T:
        self.get(name)
        return self._items.pop(name)

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
