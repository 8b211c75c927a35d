"""Peers: other libraries' Reformer attention measured by our own harness, beside our backends.

A peer is a block-level module, (b, n, hidden) -> (b, n, hidden) with its own projections, built
from a `BenchCase` exactly where our `SelfAttention` block would be, so `measure_case` times and
profiles it with the same code. A peer takes a subset of the option names of the backend it
mirrors (`lsh`, `local`), so a grid gives both sides the same settings. Each stored peer case
carries its package and version (`BenchCase.peer`) and what it computes differently (`note`).
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from ..declarative import check_keys, field_names
from ..errors import OptionError, UnknownNameError
from ..registry import Registry

if TYPE_CHECKING:
    from .cases import BenchCase


@dataclass(frozen=True, kw_only=True)
class PeerSpec:
    """A registered peer: where it comes from, which backend of ours it mirrors, how to build it."""

    name: str  # "<family>:<mechanism>", e.g. "hf:lsh"
    package: str  # distribution name (pip), e.g. "transformers"
    module: str  # import name, e.g. "transformers"
    mirrors: str  # our backend it is compared with
    options: type  # frozen dataclass: the options it takes (names as the mirrored backend's)
    build: Callable[[BenchCase, Any], nn.Module]  # (case, options) -> block module
    note: str  # what it computes differently from the mirrored backend's default
    check: Callable[[BenchCase, Any], str | None] = lambda case, options: None  # extra limits

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

    def unsupported(self, case: BenchCase) -> str | None:
        """Why `case` cannot run with this peer here, or None."""
        if self.version() is None or importlib.util.find_spec(self.module) is None:
            return f"{self.package} is not installed (pip install {self.package})"
        if case.target != "block":
            return f"peer {self.name} owns its projections: it is measured at target 'block' only"
        return self.check(case, self.make_options(**case.options))


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
    from ..attention.lsh import auto_buckets

    buckets = auto_buckets(math.ceil(seq_len / chunk) * chunk, chunk)
    return list(buckets) if isinstance(buckets, tuple) else buckets


# ---- Hugging Face transformers ------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class HFLSHOptions:
    """Options of transformers' LSHSelfAttention (names as our lsh's)."""

    num_hashes: int = 1
    num_buckets: int | tuple[int, int] | list[int] | None = None  # None: our lsh's rule
    chunk_length: int = 64
    num_chunks_before: int = 1
    num_chunks_after: int = 0
    seed: int | None = None  # HF's hash_seed


@dataclass(frozen=True, kw_only=True)
class HFLocalOptions:
    """Options of transformers' LocalSelfAttention (names as our local's)."""

    chunk_length: int = 64
    num_chunks_before: int = 1
    num_chunks_after: int = 0


class HFBlock(nn.Module):
    """A transformers self-attention module plus the output projection that its
    ReformerAttention adds (Linear(inner, hidden), no bias), as our SelfAttention block has."""

    def __init__(self, attention: nn.Module, inner: int, hidden: int) -> None:
        super().__init__()
        self.attention = attention
        self.out = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """(b, n, hidden) -> (b, n, hidden)."""
        return self.out(self.attention(x).hidden_states)


def _hf_config(case: BenchCase, **fields: Any) -> Any:
    from transformers import ReformerConfig

    return ReformerConfig(
        hidden_size=case.hidden,
        num_attention_heads=case.num_heads,
        attention_head_size=case.head_dim,
        is_decoder=case.causal,
        max_position_embeddings=case.seq_len,
        lsh_attention_probs_dropout_prob=0.0,
        local_attention_probs_dropout_prob=0.0,
        hidden_dropout_prob=0.0,
        **fields,
    )


def _build_hf_lsh(case: BenchCase, options: HFLSHOptions) -> nn.Module:
    from transformers.models.reformer.modeling_reformer import LSHSelfAttention

    config = _hf_config(
        case,
        num_hashes=options.num_hashes,
        num_buckets=resolve_buckets(case.seq_len, options.chunk_length, options.num_buckets),
        hash_seed=options.seed,
        lsh_attn_chunk_length=options.chunk_length,
        lsh_num_chunks_before=options.num_chunks_before,
        lsh_num_chunks_after=options.num_chunks_after,
    )
    return HFBlock(LSHSelfAttention(config), case.num_heads * case.head_dim, case.hidden)


def _build_hf_local(case: BenchCase, options: HFLocalOptions) -> nn.Module:
    from transformers.models.reformer.modeling_reformer import LocalSelfAttention

    config = _hf_config(
        case,
        local_attn_chunk_length=options.chunk_length,
        local_num_chunks_before=options.num_chunks_before,
        local_num_chunks_after=options.num_chunks_after,
    )
    return HFBlock(LocalSelfAttention(config), case.num_heads * case.head_dim, case.hidden)


PEERS.add(
    "hf:lsh",
    PeerSpec(
        name="hf:lsh",
        package="transformers",
        module="transformers",
        mirrors="lsh",
        options=HFLSHOptions,
        build=_build_hf_lsh,
        note=(
            "transformers' LSHSelfAttention + output Linear: attends across buckets inside its "
            "chunk window, windows wrap around the hash rounds, a chunk-aligned causal window "
            "(a future token can shift it), full attention when L <= chunk; this is the function "
            "of our lsh with semantics='hf', not of lsh's exact default"
        ),
    ),
)
PEERS.add(
    "hf:local",
    PeerSpec(
        name="hf:local",
        package="transformers",
        module="transformers",
        mirrors="local",
        options=HFLocalOptions,
        build=_build_hf_local,
        note=(
            "transformers' LocalSelfAttention + output Linear: neighbour chunks wrap around the "
            "sequence ends (masked only when causal), finite mask values; the function of our "
            "local with semantics='hf'"
        ),
    ),
)


# ---- lucidrains' reformer-pytorch ---------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class LucidLSHOptions:
    """Options of reformer-pytorch's LSHSelfAttention (names as our lsh's)."""

    num_hashes: int = 1  # n_hashes
    chunk_length: int = 64  # bucket_size: it attends its chunk and one chunk back
    num_chunks_before: int = 1  # fixed at 1 by reformer-pytorch
    num_chunks_after: int = 0  # fixed at 0 by reformer-pytorch


def _check_lucid(case: BenchCase, options: LucidLSHOptions) -> str | None:
    if (options.num_chunks_before, options.num_chunks_after) != (1, 0):
        return (
            "reformer-pytorch attends exactly one chunk back and none ahead "
            f"(num_chunks_before=1, num_chunks_after=0), not {options.num_chunks_before}/"
            f"{options.num_chunks_after}"
        )
    if case.seq_len % (2 * options.chunk_length):
        return (
            f"reformer-pytorch needs the length to be a multiple of 2 x chunk_length "
            f"({2 * options.chunk_length}); L={case.seq_len} is not"
        )
    return None


def _build_lucid_lsh(case: BenchCase, options: LucidLSHOptions) -> nn.Module:
    from reformer_pytorch import LSHSelfAttention

    return LSHSelfAttention(
        dim=case.hidden,
        heads=case.num_heads,
        dim_head=case.head_dim,
        bucket_size=options.chunk_length,
        n_hashes=options.num_hashes,
        causal=case.causal,
    )


PEERS.add(
    "lucid:lsh",
    PeerSpec(
        name="lucid:lsh",
        package="reformer-pytorch",
        module="reformer_pytorch",
        mirrors="lsh",
        options=LucidLSHOptions,
        build=_build_lucid_lsh,
        check=_check_lucid,
        note=(
            "reformer-pytorch's LSHSelfAttention: attends across buckets (its default), "
            "L / chunk_length buckets (its fixed rule, ours 2L / chunk), unseeded rotations, "
            "output Linear with bias; closest to our lsh with semantics='hf'"
        ),
    ),
)


__all__ = [
    "PEERS",
    "PeerSpec",
    "families",
    "get_peer",
    "is_peer",
    "peer_note",
    "reference_backend",
    "resolve_buckets",
    "select_peers",
]
