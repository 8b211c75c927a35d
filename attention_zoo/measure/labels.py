"""How a measured variant is named in tables, plots and reports: one spelling everywhere.

Options equal to the backend's registered defaults are left out, so `lsh` and `lsh(num_hashes=1)`
(1 being the default) are one variant with one label. Backends the registry does not know (a peer
such as `hf:lsh`, a plugin not imported) keep every option.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..attention.spec import BACKENDS, get_backend
from ..errors import ZooError
from . import peers
from .status import STATUS_TEXT

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


# ---- one vocabulary for `zoo bench`, `zoo results` and the report ----------------------------

# What a backend computes (attention.spec.Capabilities.kind), as tables and plots name it.
KIND_TEXT = {
    "full": "exact",
    "pattern": "exact pattern",
    "recurrent": "recurrent",
    "approximate": "approximate",
}
UNKNOWN_KIND = "?"  # a backend this version does not know (a plugin not imported)
EXACT_CLASS, APPROX_CLASS = "exact", "not exact"  # full vs pattern-or-approximate
RATIO_WORDS = {"time": "time", "memory": "memory", "state": "state"}  # ratio columns' first word
PEAK, STATE = "peak_bytes", "state_bytes"  # the memory metrics a ratio or a ranking compares


def memory_metric(mode: str) -> str:
    """The memory a case of `mode` is compared by: a decode case by the decoding state it keeps
    between tokens (its step's transient peak is shown beside it), any other by its peak."""
    return STATE if mode == "decode" else PEAK


def memory_word(metric: str) -> str:
    """The RATIO_WORDS entry of a memory metric: `state x sdpa`, `memory x sdpa`."""
    return "state" if metric == STATE else "memory"


_KIND_ORDER = ("full", "pattern", "recurrent", "approximate")  # most exact first


def backend_kind(backend: str, options: dict[str, Any] | str | None = None) -> str:
    """'full', 'pattern', 'recurrent' or 'approximate' for a registered backend (with its
    options), a peer (its mirrored backend's kind) or a model's `a+b` layer mix (the least exact
    of its layers); UNKNOWN_KIND otherwise."""
    names = backend.split("+")
    kinds = []
    for name in names:
        if name not in BACKENDS and (base := re.fullmatch(r"(.+)-\d+", name)):
            name = base.group(1)  # a task's variant label: the hash count after a dash (lsh-2)
        if name not in BACKENDS and name in peers.PEERS:
            name = peers.PEERS.get(name).mirrors
        if name not in BACKENDS:
            return UNKNOWN_KIND
        spec = BACKENDS.get(name)
        try:
            caps = spec.caps_for(**resolve_options(name, options)) if len(names) == 1 else spec.caps
        except (ZooError, TypeError):  # options this version does not take: the default's kind
            caps = spec.caps
        kinds.append(caps.kind)
    return max(kinds, key=_KIND_ORDER.index)


def facts_of(value: Any) -> dict[str, Any]:
    """A stored case's facts as a dict, however its row was read: a dict (ResultStore.rows()),
    JSON text (a CSV export, a report's rows.csv), or nothing (rows stored before facts): {}."""
    if isinstance(value, dict):
        return value
    if isinstance(value, str) and value.strip():
        try:
            loaded = json.loads(value)
        except json.JSONDecodeError:
            return {}
        return loaded if isinstance(loaded, dict) else {}
    return {}


KERNEL_HEADER = "kernel"  # the implementation column: bench, results and the report


def kernel_text(facts: dict[str, Any] | None) -> str:
    """The implementation a case ran (its facts' "kernels"): 'flex'; several backends
    'local: cpu-fused, lsh: flex'; ' (captured)' after it when its step was a CUDA graph's
    replay, with what the replay computes apart from the plain step where it differs
    (' (captured; attends all 80 cache slots, masked past its count)'); '-' when not stored
    (rows of older versions, peers)."""
    kernels = (facts or {}).get("kernels") or {}
    if not isinstance(kernels, dict) or not kernels:
        return "-"
    graphs = (facts or {}).get("cuda_graphs") or {}
    replayed = ""
    if isinstance(graphs, dict) and graphs.get("on"):
        replayed = f" (captured; {graphs['differs']})" if graphs.get("differs") else " (captured)"
    if len(kernels) == 1:
        return f"{next(iter(kernels.values()))}{replayed}"
    return ", ".join(f"{backend}: {name}" for backend, name in kernels.items()) + replayed


def case_kind(config: dict[str, Any], facts: dict[str, Any] | None = None) -> str:
    """What a stored case computes: its backend's kind from the registry now (backend_kind),
    else from the capabilities stored with the case when it was measured (a plugin not imported
    now), else UNKNOWN_KIND."""
    backend = str(config.get("backend", ""))
    kind = backend_kind(backend, config.get("options"))
    if kind != UNKNOWN_KIND:
        return kind
    stored = (facts or {}).get("capabilities") or {}
    kinds = [_stored_kind(stored.get(name)) for name in backend.split("+")]
    if not kinds or UNKNOWN_KIND in kinds:
        return UNKNOWN_KIND
    return max(kinds, key=_KIND_ORDER.index)


def _stored_kind(caps: Any) -> str:
    """The kind of a Capabilities.to_dict() as stored ('kind', else derived from its flags)."""
    if not isinstance(caps, dict):
        return UNKNOWN_KIND
    if caps.get("kind") in _KIND_ORDER:
        return str(caps["kind"])
    if "exact" not in caps:
        return UNKNOWN_KIND
    return "full" if caps["exact"] else "pattern" if caps.get("fixed_pattern") else "approximate"


def kind_text(kind: str) -> str:
    """How a table names what a variant computes (KIND_TEXT; '?' for an unknown backend)."""
    return KIND_TEXT.get(kind, UNKNOWN_KIND)


def kind_class(kind: str) -> str:
    """EXACT_CLASS for full attention; APPROX_CLASS for what computes something else."""
    return EXACT_CLASS if kind == "full" else APPROX_CLASS


def ratio_header(word: str, reference: str) -> str:
    """The header of a ratio column: `time x sdpa` (value / the reference's value)."""
    return f"{RATIO_WORDS[word]} x {reference}"


def status_text(status: str, reason: str = "") -> str:
    """A case's status as every table shows it, with its reason when it has one."""
    text = STATUS_TEXT.get(status, status)
    return f"{text}: {reason}" if reason else text
