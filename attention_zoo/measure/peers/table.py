"""The built-in peers as one table: each package's peers (name, options, builder, limits) and what
each computes differently from the backend it mirrors, registered by `register`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import nn

from .hf import HFLocalOptions, HFLSHOptions, build_hf_local, build_hf_lsh
from .lucid import (
    LucidLinformerOptions,
    LucidLocalOptions,
    LucidLSHOptions,
    LucidNystromOptions,
    LucidPerformerOptions,
    LucidSlidingOptions,
    build_lucid_linformer,
    build_lucid_local,
    build_lucid_lsh,
    build_lucid_nystrom,
    build_lucid_performer,
    build_lucid_sliding,
    check_lucid_linformer,
    check_lucid_lsh,
    check_lucid_nystrom,
    check_lucid_performer,
    check_lucid_sliding,
)
from .spec import PEERS, PeerCase, PeerSpec

Row = tuple[
    str,  # "<family>:<the backend it mirrors>"
    type,  # its options
    Callable[[PeerCase, Any], nn.Module],  # its builder
    Callable[[PeerCase, Any], str | None] | None,  # what it cannot run, beyond a missing package
]

# (package (pip), module (import)) -> its peers
PEER_TABLE: dict[tuple[str, str], list[Row]] = {
    ("transformers", "transformers"): [
        ("hf:lsh", HFLSHOptions, build_hf_lsh, None),
        ("hf:local", HFLocalOptions, build_hf_local, None),
    ],
    ("reformer-pytorch", "reformer_pytorch"): [
        ("lucid:lsh", LucidLSHOptions, build_lucid_lsh, check_lucid_lsh),
    ],
    ("local-attention", "local_attention"): [
        ("lucid:local", LucidLocalOptions, build_lucid_local, None),
        ("lucid:sliding-window", LucidSlidingOptions, build_lucid_sliding, check_lucid_sliding),
    ],
    ("performer-pytorch", "performer_pytorch"): [
        ("lucid:performer", LucidPerformerOptions, build_lucid_performer, check_lucid_performer),
    ],
    ("linformer", "linformer"): [
        ("lucid:linformer", LucidLinformerOptions, build_lucid_linformer, check_lucid_linformer),
    ],
    ("nystrom-attention", "nystrom_attention"): [
        ("lucid:nystrom", LucidNystromOptions, build_lucid_nystrom, check_lucid_nystrom),
    ],
}

# What each peer computes differently from the mirrored backend's default (stored with its cases).
PEER_NOTES: dict[str, str] = {
    "hf:lsh": (
        "transformers' LSHSelfAttention + output Linear: attends across buckets inside its "
        "chunk window, windows wrap around the hash rounds, a chunk-aligned causal window "
        "(a future token can shift it), full attention when L <= chunk; this is the function "
        "of our lsh with semantics='hf', not of lsh's exact default"
    ),
    "hf:local": (
        "transformers' LocalSelfAttention + output Linear: neighbour chunks wrap around the "
        "sequence ends (masked only when causal), finite mask values; the function of our "
        "local with semantics='hf'"
    ),
    "lucid:lsh": (
        "reformer-pytorch's LSHSelfAttention: attends across buckets (its default), "
        "L / chunk_length buckets (its fixed rule, ours 2L / chunk), unseeded rotations, "
        "output Linear with bias; closest to our lsh with semantics='hf'"
    ),
    "lucid:local": (
        "local-attention's LocalMHA (rotary embeddings off): the chunked windows of our local "
        "(exact semantics), materialised scores; bidirectional at a length not a multiple of "
        "the chunk, queries also see the zero keys its padding appends"
    ),
    "lucid:sliding-window": (
        "local-attention's LocalMHA with exact_windowsize (rotary embeddings off) built with "
        "window_size = window - 1, so it sees our band: window keys causal (i - window < j "
        "<= i), 2 window - 1 bidirectional (|i - j| < window); window 1 runs its window 1 "
        "(2 keys causal, 3 bidirectional); no global tokens, materialised chunk scores; "
        "bidirectional at a length not a multiple of window - 1, queries also see the zero "
        "keys its padding appends"
    ),
    "lucid:performer": (
        "performer-pytorch's SelfAttention: FAVOR+ positive orthogonal features drawn at "
        "init, unseeded (redrawn only by its Performer wrapper), causal by its chunked "
        "prefix sums without CUDA, output Linear with bias"
    ),
    "lucid:linformer": (
        "linformer's LinformerSelfAttention: projections made for max_length, sliced for "
        "shorter inputs; share_kv also shares the key and value linear maps (values = keys), "
        "output Linear with bias"
    ),
    "lucid:nystrom": (
        "nystrom-attention's NystromAttention: pads the front of the sequence to a multiple "
        "of the landmarks, pseudo-inverse initialised from the whole batch's maximum, output "
        "Linear with bias and dropout layer"
    ),
}


def register(table: Mapping[tuple[str, str], Sequence[Row]], notes: Mapping[str, str]) -> None:
    """Register every peer of `table` with its note; a peer mirrors the backend its name ends
    in."""
    for (package, module), rows in table.items():
        for name, options, build, check in rows:
            spec = PeerSpec(
                name=name,
                package=package,
                module=module,
                mirrors=name.partition(":")[2],
                options=options,
                build=build,
                check=check,
                note=notes[name],
            )
            PEERS.add(name, spec)


register(PEER_TABLE, PEER_NOTES)
