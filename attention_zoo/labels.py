"""How a measured variant is named in tables, plots and reports: one spelling everywhere."""

from __future__ import annotations

import json
from typing import Any


def variant_label(backend: str, options: dict[str, Any] | str | None) -> str:
    """`lsh(num_hashes=4)`: the backend with the options that set it apart (JSON text accepted)."""
    if isinstance(options, str):
        options = json.loads(options) if options else {}
    if not options:
        return backend
    shown = ", ".join(f"{k}={v}" for k, v in sorted(options.items()))
    return f"{backend}({shown})"
