"""How a measured variant is named in tables, plots and reports: one spelling everywhere.

Options equal to the backend's registered defaults are left out, so `lsh` and `lsh(num_hashes=1)`
(1 being the default) are one variant with one label. Backends the registry does not know (a peer
such as `hf:lsh`, a plugin not imported) keep every option.
"""

from __future__ import annotations

import json
from typing import Any

from ..attention.spec import get_backend
from ..errors import ZooError
from . import peers

# The backend every ratio divides by unless --reference says otherwise: today's fused exact kernel,
# what a user would run instead (full, the naive n x n one, is the dense reference of exactness).
DEFAULT_REFERENCE = "sdpa"


def resolve_options(backend: str, options: dict[str, Any] | str | None) -> dict[str, Any]:
    """`options` without those equal to `backend`'s registered defaults (JSON text accepted)."""
    if isinstance(options, str):
        options = json.loads(options) if options else {}
    if not options:
        return {}
    try:
        defaults = get_backend(backend).defaults()
    except ZooError:
        return dict(options)
    return {k: v for k, v in options.items() if k not in defaults or not _same(v, defaults[k])}


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def variant_label(backend: str, options: dict[str, Any] | str | None, *, name: str = "") -> str:
    """`lsh(num_hashes=4)`: `name` (default: the backend) with the options that set it apart."""
    shown = resolve_options(backend, options)
    name = name or backend
    if not shown:
        return name
    return f"{name}({', '.join(f'{k}={v}' for k, v in sorted(shown.items()))})"


def measured_on_peer(config: dict[str, Any]) -> bool:
    """A stored case measured on another library's attention: it carries the peer's provenance
    (kept even when the plugin that registered the peer is not loaded now), or names a peer."""
    return bool(config.get("peer")) or peers.is_peer(str(config.get("backend", "")))


def case_label(config: dict[str, Any]) -> str:
    """A case's label (or backend) with its non-default options; peers say so."""
    label = variant_label(
        str(config.get("backend", "?")), config.get("options"), name=config.get("label") or ""
    )
    return f"{label} (peer)" if measured_on_peer(config) else label
