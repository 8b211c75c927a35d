"""What a peer is (`PeerSpec`), the registry of peers and the questions asked of it: is a backend
name a peer, which peers mirror the measured backends, which case a ratio divides by."""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Protocol

from torch import nn

from ...attention.lsh import auto_buckets
from ...declarative import check_keys, field_names
from ...errors import OptionError, UnknownNameError
from ...registry import Registry


class PeerCase(Protocol):
    """What a peer reads of the case it is built for (a BenchCase has all of it)."""

    target: str
    seq_len: int
    num_heads: int
    head_dim: int
    hidden: int
    causal: bool
    options: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class PeerSpec:
    """A registered peer: where it comes from, which backend of ours it mirrors, how to build it."""

    name: str  # "<family>:<mechanism>", e.g. "hf:lsh"
    package: str  # distribution name (pip), e.g. "transformers"
    module: str  # import name, e.g. "transformers"
    mirrors: str  # our backend it is compared with
    options: type  # frozen dataclass: the options it takes (names as the mirrored backend's)
    build: Callable[[PeerCase, Any], nn.Module]  # (case, options) -> block module
    note: str  # what it computes differently from the mirrored backend's default
    check: Callable[[PeerCase, Any], str | None] | None = None  # what it cannot run, if any

    @property
    def family(self) -> str:
        return self.name.split(":", 1)[0]

    def version(self) -> str | None:
        """Installed version of the package, or None when it is not installed."""
        try:
            return metadata.version(self.package)
        except metadata.PackageNotFoundError:
            return None

    def provenance(self) -> str:
        """'package version' as stored with every case of this peer."""
        return f"{self.package} {self.version() or '(not installed)'}"

    def make_options(self, **options: Any) -> Any:
        check_keys(options, field_names(self.options), where=f"peer {self.name!r}",
                   noun="option", error=OptionError)  # fmt: skip
        return self.options(**options)

    def inherit(self, options: dict[str, Any]) -> dict[str, Any]:
        """The mirrored backend's options this peer also takes (the rest do not apply to it)."""
        accepted = set(field_names(self.options))
        return {k: v for k, v in options.items() if k in accepted}

    def unsupported(self, case: PeerCase) -> str | None:
        """Why `case` cannot run with this peer here, or None."""
        if self.version() is None or importlib.util.find_spec(self.module) is None:
            return f"{self.package} is not installed (pip install {self.package})"
        if case.target != "block":
            return f"peer {self.name} owns its projections: it is measured at target 'block' only"
        options = self.make_options(**case.options)
        return self.check(case, options) if self.check else None


PEERS: Registry[PeerSpec] = Registry("attention peer")


def is_peer(name: str) -> bool:
    return name in PEERS


def get_peer(name: str) -> PeerSpec:
    return PEERS.get(name)


def families() -> list[str]:
    return list(dict.fromkeys(spec.family for spec in PEERS))


def select_peers(wanted: Iterable[str], backends: Iterable[str]) -> list[str]:
    """Peer names for `wanted` (families like 'hf' or peer names) that mirror one of `backends`.

    A family brings only the peers whose mirrored backend is measured, so every peer row has a
    row of ours to compare with; a peer named explicitly is always taken.
    """
    backends = set(backends)
    out: list[str] = []
    for item in wanted:
        if item in PEERS:
            out.append(item)
            continue
        if item not in families():
            raise UnknownNameError("peer or peer family", item, [*families(), *PEERS.names()])
        out += [s.name for s in PEERS if s.family == item and s.mirrors in backends]
    return list(dict.fromkeys(out))


def peer_note(config: dict[str, Any]) -> str:
    """What a stored case's peer computes differently ('' for our own backends)."""
    if config.get("note"):
        return str(config["note"])
    backend = config.get("backend", "")
    return PEERS.get(backend).note if is_peer(backend) else ""


def reference_backend(reference: str | None, backend: str) -> str | None:
    """The backend whose case a `backend` case is divided by in ratio tables: `reference` itself,
    or for a peer family ('hf') its peer of the same mechanism (lsh -> hf:lsh; None if none)."""
    if reference is None or reference not in families():
        return reference
    mechanism = get_peer(backend).mirrors if is_peer(backend) else backend
    return next((s.name for s in PEERS if s.family == reference and s.mirrors == mechanism), None)


def resolve_buckets(seq_len: int, chunk: int, num_buckets: Any) -> Any:
    """The bucket count our lsh would use at `seq_len` (given explicitly to a peer, so both sides
    hash into the same number of buckets)."""
    if num_buckets is not None:
        return list(num_buckets) if isinstance(num_buckets, (tuple, list)) else num_buckets
    buckets = auto_buckets(math.ceil(seq_len / chunk) * chunk, chunk)
    return list(buckets) if isinstance(buckets, tuple) else buckets
