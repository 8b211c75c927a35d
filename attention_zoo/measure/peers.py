"""Peers: other libraries' attention modules measured by our own harness, beside our backends.

A peer is a block-level module, (b, n, hidden) -> (b, n, hidden) with its own projections, built
from a `BenchCase` exactly where our `SelfAttention` block would be, so `measure_case` times and
profiles it with the same code. A peer takes a subset of the option names of the backend it
mirrors (`lsh`, `local`, `sliding-window`, `performer`, ...), so a grid gives both sides the
same settings. Each stored peer case carries its package and version (`BenchCase.peer`) and what
it computes differently (`note`).
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Protocol

from torch import Tensor, nn

from ..attention.lsh import auto_buckets
from ..declarative import check_keys, field_names
from ..errors import OptionError, UnknownNameError
from ..registry import Registry


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
    check: Callable[[PeerCase, Any], str | None] = lambda case, options: None  # extra limits

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


def _hf_config(case: PeerCase, **fields: Any) -> Any:
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


def _build_hf_lsh(case: PeerCase, options: HFLSHOptions) -> nn.Module:
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


def _build_hf_local(case: PeerCase, options: HFLocalOptions) -> nn.Module:
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


def _check_lucid(case: PeerCase, options: LucidLSHOptions) -> str | None:
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


def _build_lucid_lsh(case: PeerCase, options: LucidLSHOptions) -> nn.Module:
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


# ---- lucidrains' efficient-attention packages ---------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class LucidLocalOptions:
    """Options of local-attention's LocalMHA as chunked windows (names as our local's)."""

    chunk_length: int = 64  # window_size: its chunk
    num_chunks_before: int = 1  # look_backward
    num_chunks_after: int = 0  # look_forward (none when causal)


@dataclass(frozen=True, kw_only=True)
class LucidSlidingOptions:
    """Options of local-attention's LocalMHA as an exact-size window (names as sliding-window's)."""

    window: int = 256  # window_size, with exact_windowsize=True
    global_tokens: int = 0  # local-attention has none: only 0 runs


@dataclass(frozen=True, kw_only=True)
class LucidPerformerOptions:
    """Options of performer-pytorch's SelfAttention (names as our performer's)."""

    nb_features: int = 256  # random features per head


@dataclass(frozen=True, kw_only=True)
class LucidLinformerOptions:
    """Options of linformer's LinformerSelfAttention (names as our linformer's)."""

    proj_length: int = 256  # k: the projected length of keys and values
    max_length: int = 4096  # seq_len: the length its projections are made for
    share_kv: bool = True  # one projection (and one key/value linear) for keys and values


@dataclass(frozen=True, kw_only=True)
class LucidNystromOptions:
    """Options of nystrom-attention's NystromAttention (names as our nystrom's)."""

    num_landmarks: int = 64
    pinv_iterations: int = 6
    conv_kernel: int = 0  # residual_conv_kernel; 0: residual=False


def _lucid_check(
    package: str, *, bidirectional_only: bool
) -> Callable[[PeerCase, Any], str | None]:
    """What a lucidrains attention module cannot run: causal (when bidirectional only), heads
    that do not divide the hidden size, lengths past its projections' max_length."""

    def check(case: PeerCase, options: Any) -> str | None:
        if bidirectional_only and case.causal:
            return f"{package} is bidirectional only (run with causal off)"
        if case.hidden % case.num_heads:
            return f"{package} needs hidden ({case.hidden}) divisible by heads ({case.num_heads})"
        if getattr(options, "max_length", case.seq_len) < case.seq_len:
            return f"{package} projections are made for L <= max_length={options.max_length}"
        return None

    return check


def _check_lucid_sliding(case: PeerCase, options: LucidSlidingOptions) -> str | None:
    if options.global_tokens:
        return (
            f"local-attention has no global tokens (global_tokens=0), not {options.global_tokens}"
        )
    return None


def _local_mha(case: PeerCase, window: int, before: int, after: int, exact: bool) -> nn.Module:
    from local_attention import LocalMHA

    return LocalMHA(
        dim=case.hidden,
        window_size=window,
        dim_head=case.head_dim,
        heads=case.num_heads,
        causal=case.causal,
        exact_windowsize=exact,
        look_backward=before,
        look_forward=0 if case.causal else after,
        use_rotary_pos_emb=False,  # ours has no position embedding inside attention
    )


def _build_lucid_local(case: PeerCase, options: LucidLocalOptions) -> nn.Module:
    before, after = options.num_chunks_before, options.num_chunks_after
    return _local_mha(case, options.chunk_length, before, after, exact=False)


def _build_lucid_sliding(case: PeerCase, options: LucidSlidingOptions) -> nn.Module:
    """Its exact window w sees i - w <= j <= i (bidirectional: |i - j| <= w), so w = window - 1
    is our band i - window < j <= i (|i - j| < window); window 1 cannot be matched (w >= 1)."""
    return _local_mha(case, max(options.window - 1, 1), 1, 1, exact=True)


def _build_lucid_performer(case: PeerCase, options: LucidPerformerOptions) -> nn.Module:
    from performer_pytorch import SelfAttention

    return SelfAttention(
        dim=case.hidden,
        causal=case.causal,
        heads=case.num_heads,
        dim_head=case.head_dim,
        nb_features=options.nb_features,
    )


def _build_lucid_linformer(case: PeerCase, options: LucidLinformerOptions) -> nn.Module:
    from linformer import LinformerSelfAttention

    return LinformerSelfAttention(
        dim=case.hidden,
        seq_len=options.max_length,
        k=options.proj_length,
        heads=case.num_heads,
        dim_head=case.head_dim,
        share_kv=options.share_kv,
    )


def _build_lucid_nystrom(case: PeerCase, options: LucidNystromOptions) -> nn.Module:
    from nystrom_attention import NystromAttention

    return NystromAttention(
        dim=case.hidden,
        dim_head=case.head_dim,
        heads=case.num_heads,
        num_landmarks=options.num_landmarks,
        pinv_iterations=options.pinv_iterations,
        residual=options.conv_kernel > 0,
        residual_conv_kernel=options.conv_kernel or 33,
    )


for _spec in (
    PeerSpec(
        name="lucid:local",
        package="local-attention",
        module="local_attention",
        mirrors="local",
        options=LucidLocalOptions,
        build=_build_lucid_local,
        note=(
            "local-attention's LocalMHA (rotary embeddings off): the chunked windows of our local "
            "(exact semantics), materialised scores; bidirectional at a length not a multiple of "
            "the chunk, queries also see the zero keys its padding appends"
        ),
    ),
    PeerSpec(
        name="lucid:sliding-window",
        package="local-attention",
        module="local_attention",
        mirrors="sliding-window",
        options=LucidSlidingOptions,
        build=_build_lucid_sliding,
        check=_check_lucid_sliding,
        note=(
            "local-attention's LocalMHA with exact_windowsize (rotary embeddings off) built with "
            "window_size = window - 1, so it sees our band: window keys causal (i - window < j "
            "<= i), 2 window - 1 bidirectional (|i - j| < window); window 1 runs its window 1 "
            "(2 keys causal, 3 bidirectional); no global tokens, materialised chunk scores; "
            "bidirectional at a length not a multiple of window - 1, queries also see the zero "
            "keys its padding appends"
        ),
    ),
    PeerSpec(
        name="lucid:performer",
        package="performer-pytorch",
        module="performer_pytorch",
        mirrors="performer",
        options=LucidPerformerOptions,
        build=_build_lucid_performer,
        check=_lucid_check("performer-pytorch", bidirectional_only=False),
        note=(
            "performer-pytorch's SelfAttention: FAVOR+ positive orthogonal features drawn at "
            "init, unseeded (redrawn only by its Performer wrapper), causal by its chunked "
            "prefix sums without CUDA, output Linear with bias"
        ),
    ),
    PeerSpec(
        name="lucid:linformer",
        package="linformer",
        module="linformer",
        mirrors="linformer",
        options=LucidLinformerOptions,
        build=_build_lucid_linformer,
        check=_lucid_check("linformer", bidirectional_only=True),
        note=(
            "linformer's LinformerSelfAttention: projections made for max_length, sliced for "
            "shorter inputs; share_kv also shares the key and value linear maps (values = keys), "
            "output Linear with bias"
        ),
    ),
    PeerSpec(
        name="lucid:nystrom",
        package="nystrom-attention",
        module="nystrom_attention",
        mirrors="nystrom",
        options=LucidNystromOptions,
        build=_build_lucid_nystrom,
        check=_lucid_check("nystrom-attention", bidirectional_only=True),
        note=(
            "nystrom-attention's NystromAttention: pads the front of the sequence to a multiple "
            "of the landmarks, pseudo-inverse initialised from the whole batch's maximum, output "
            "Linear with bias and dropout layer"
        ),
    ),
):
    PEERS.add(_spec.name, _spec)


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
