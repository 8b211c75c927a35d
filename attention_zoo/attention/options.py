"""Checks of the options the backends' configs share (chunk lengths, counts, sizes, flags)."""

from __future__ import annotations

from ..errors import OptionError


def check_int(name: str, value: object, *, minimum: int, backend: str) -> None:
    """Raise OptionError unless value is an int >= minimum (bools rejected)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise OptionError(f"{backend} option {name} must be an int >= {minimum}, got {value!r}")


def check_flag(backend: str, name: str, value: object) -> None:
    """Raise OptionError unless value is True or False."""
    if not isinstance(value, bool):
        raise OptionError(f"{backend} option {name} must be True or False, got {value!r}")


def check_chunking(backend: str, chunk_length: int, before: int, after: int) -> None:
    check_int("chunk_length", chunk_length, minimum=1, backend=backend)
    check_int("num_chunks_before", before, minimum=0, backend=backend)
    check_int("num_chunks_after", after, minimum=0, backend=backend)
