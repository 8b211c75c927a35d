"""Compatibility: the labels moved to measure/labels.py; report/frame.py still imports them here."""

from .measure.labels import (
    DEFAULT_REFERENCE,
    case_label,
    measured_on_peer,
    resolve_options,
    variant_label,
)

is_peer = measured_on_peer  # report/frame.py's name until it calls measured_on_peer

__all__ = [
    "DEFAULT_REFERENCE",
    "case_label",
    "is_peer",
    "measured_on_peer",
    "resolve_options",
    "variant_label",
]
