"""lucidrains' attention packages as peers: reformer-pytorch (`lucid:lsh`), local-attention
(`lucid:local`, `lucid:sliding-window`), performer-pytorch, linformer and nystrom-attention: their
options, limits and builders (table.py registers them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from .spec import PeerCase


@dataclass(frozen=True, kw_only=True)
class LucidLSHOptions:
    """Options of reformer-pytorch's LSHSelfAttention (names as our lsh's)."""

    num_hashes: int = 1  # n_hashes
    chunk_length: int = 64  # bucket_size: it attends its chunk and one chunk back
    num_chunks_before: int = 1  # fixed at 1 by reformer-pytorch
    num_chunks_after: int = 0  # fixed at 0 by reformer-pytorch


def check_lucid_lsh(case: PeerCase, options: LucidLSHOptions) -> str | None:
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


def _dims(case: PeerCase) -> dict[str, int]:
    """The width, heads and head size every lucidrains attention module takes."""
    return {"dim": case.hidden, "heads": case.num_heads, "dim_head": case.head_dim}


def build_lucid_lsh(case: PeerCase, options: LucidLSHOptions) -> nn.Module:
    from reformer_pytorch import LSHSelfAttention

    return LSHSelfAttention(
        **_dims(case),
        bucket_size=options.chunk_length,
        n_hashes=options.num_hashes,
        causal=case.causal,
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


check_lucid_performer = _lucid_check("performer-pytorch", bidirectional_only=False)
check_lucid_linformer = _lucid_check("linformer", bidirectional_only=True)
check_lucid_nystrom = _lucid_check("nystrom-attention", bidirectional_only=True)


def check_lucid_sliding(case: PeerCase, options: LucidSlidingOptions) -> str | None:
    if options.global_tokens:
        return (
            f"local-attention has no global tokens (global_tokens=0), not {options.global_tokens}"
        )
    return None


def _local_mha(case: PeerCase, window: int, before: int, after: int, exact: bool) -> nn.Module:
    from local_attention import LocalMHA

    return LocalMHA(
        **_dims(case),
        window_size=window,
        causal=case.causal,
        exact_windowsize=exact,
        look_backward=before,
        look_forward=0 if case.causal else after,
        use_rotary_pos_emb=False,  # ours has no position embedding inside attention
    )


def build_lucid_local(case: PeerCase, options: LucidLocalOptions) -> nn.Module:
    before, after = options.num_chunks_before, options.num_chunks_after
    return _local_mha(case, options.chunk_length, before, after, exact=False)


def build_lucid_sliding(case: PeerCase, options: LucidSlidingOptions) -> nn.Module:
    """Its exact window w sees i - w <= j <= i (bidirectional: |i - j| <= w), so w = window - 1
    is our band i - window < j <= i (|i - j| < window); window 1 cannot be matched (w >= 1)."""
    return _local_mha(case, max(options.window - 1, 1), 1, 1, exact=True)


def build_lucid_performer(case: PeerCase, options: LucidPerformerOptions) -> nn.Module:
    from performer_pytorch import SelfAttention

    return SelfAttention(**_dims(case), causal=case.causal, nb_features=options.nb_features)


def build_lucid_linformer(case: PeerCase, options: LucidLinformerOptions) -> nn.Module:
    from linformer import LinformerSelfAttention

    return LinformerSelfAttention(
        **_dims(case), seq_len=options.max_length, k=options.proj_length, share_kv=options.share_kv
    )


def build_lucid_nystrom(case: PeerCase, options: LucidNystromOptions) -> nn.Module:
    from nystrom_attention import NystromAttention

    return NystromAttention(
        **_dims(case),
        num_landmarks=options.num_landmarks,
        pinv_iterations=options.pinv_iterations,
        residual=options.conv_kernel > 0,
        residual_conv_kernel=options.conv_kernel or 33,
    )
