"""Peers: other libraries' attention modules measured by our own harness, beside our backends.

A peer is a block-level module, (b, n, hidden) -> (b, n, hidden) with its own projections, built
from a `BenchCase` exactly where our `SelfAttention` block would be, so `measure_case` times and
profiles it with the same code. A peer takes a subset of the option names of the backend it
mirrors (`lsh`, `local`, `sliding-window`, `performer`, ...), so a grid gives both sides the
same settings. Each stored peer case carries its package and version (`BenchCase.peer`) and what
it computes differently (`note`).

spec.py holds the registry; hf.py and lucid.py build the built-in peers, table.py registers them
on import.
"""

from . import table  # noqa: F401  (registers the built-in peers)
from .spec import (
    PEERS,
    PeerCase,
    PeerSpec,
    families,
    get_peer,
    is_peer,
    peer_note,
    reference_backend,
    resolve_buckets,
    select_peers,
)

__all__ = [
    "PEERS",
    "PeerCase",
    "PeerSpec",
    "families",
    "get_peer",
    "is_peer",
    "peer_note",
    "reference_backend",
    "resolve_buckets",
    "select_peers",
]
