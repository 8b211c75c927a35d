"""Reformer LSH attention (Kitaev, Kaiser, Levskaya 2020), multi-round, exactly causal by default.

Angular LSH (Andoni et al. 2015) hashes each shared query/key into a bucket; positions are sorted by
(bucket, position) per round, the sorted sequence is cut into chunks, and each chunk attends to
itself and its neighbour chunks, only to keys of the same bucket. Rounds are combined by their
log-sum-exp weights. Causal: each query sees, within its bucket, itself and at most
chunk_length * num_chunks_before sorted predecessors -- a window no future token can shift (the
Hugging Face chunk-aligned window, kept as `hf_chunking=True`, leaks the future).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..errors import OptionError
from .base import AttentionCore
from .kernels.chunked import check_chunking, check_int, padded_length, resolve_kernel
from .kernels.lsh_fused import LSHFlash
from .kernels.lsh_hashing import (
    Buckets,
    auto_buckets,
    hash_rounds,
    round_groups,
    sort_by_bucket,
    total_buckets,
    validate_buckets,
)
from .kernels.lsh_math import lsh_math
from .kernels.lsh_plan import LSHPlan
from .spec import Capabilities, register_attention


@dataclass(frozen=True, kw_only=True)
class LSHConfig:
    """Options of LSH attention (names as Hugging Face's ReformerConfig where they exist)."""

    num_hashes: int = 1  # hash rounds, combined by log-sum-exp weights
    num_buckets: Buckets | None = (
        None  # int, factorised pair (a, b) -> a*b buckets, None = automatic
    )
    chunk_length: int = 64  # positions per chunk of the sorted sequence
    num_chunks_before: int = (
        1  # previous chunks attended (causal: the look-back, in positions x chunk)
    )
    num_chunks_after: int = 0  # following chunks attended (ignored when causal)
    seed: int | None = None  # seeds the random rotations; None draws them from torch's global RNG
    hf_chunking: bool = (
        False  # causal only: HF's chunk-aligned window (leaks the future; for comparison)
    )
    kernel: str = "auto"  # auto (flash on cpu/meta, else math), flash, math
    # hash rounds per fused forward pass; None = all at once (the backward always takes one)
    rounds_per_pass: int | None = None

    def __post_init__(self) -> None:
        check_chunking(
            "lsh", self.chunk_length, self.num_chunks_before, self.num_chunks_after, self.kernel
        )
        check_int("num_hashes", self.num_hashes, minimum=1, backend="lsh")
        if self.rounds_per_pass is not None:
            check_int("rounds_per_pass", self.rounds_per_pass, minimum=1, backend="lsh")
        if self.seed is not None:
            check_int("seed", self.seed, minimum=0, backend="lsh")
        if not isinstance(self.hf_chunking, bool):
            raise OptionError(f"lsh option hf_chunking must be a bool, got {self.hf_chunking!r}")
        object.__setattr__(self, "num_buckets", validate_buckets(self.num_buckets))


@register_attention(
    "lsh",
    config=LSHConfig,
    caps=Capabilities(shared_qk=True, exact=False, deterministic=False),
)
class LSHAttention(AttentionCore):
    """Multi-round LSH attention on shared QK; O(n * hashes * chunk) memory, exactly causal."""

    def buckets_for(self, n: int) -> Buckets:
        """The bucket count used at sequence length n (automatic when num_buckets is None)."""
        cfg = self.cfg
        npad = padded_length(n, cfg.chunk_length)
        return (
            cfg.num_buckets if cfg.num_buckets is not None else auto_buckets(npad, cfg.chunk_length)
        )

    def rotations(
        self, heads: int, d: int, nb: Buckets, device: torch.device, dtype: torch.dtype
    ) -> Tensor:
        """Random rotations (h, d, r, k): global RNG unless seeded (RNG replay reproduces them)."""
        k = nb // 2 if isinstance(nb, int) else (nb[0] + nb[1]) // 2
        shape = (heads, d, self.cfg.num_hashes, k)
        gen = None
        if self.cfg.seed is not None and device.type != "meta":
            gen = torch.Generator(device=device).manual_seed(self.cfg.seed)
        return torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)

    @torch.no_grad()
    def hash(self, qk: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """Buckets (b, h, r, n) of shared query/keys (b, h, n, d); padding gets the extra bucket."""
        return self._hash(qk, qk.shape[2], key_padding_mask)

    def _hash(self, qk: Tensor, n: int, key_padding_mask: Tensor | None) -> Tensor:
        """Buckets (b, h, r, len) of qk (b, h, len, d) whose first n positions are real."""
        b, h, length, d = qk.shape
        nb = self.buckets_for(n)
        r = self.cfg.num_hashes
        if nb == 1:
            buckets = qk.new_zeros((b, h, r, length), dtype=torch.long)
        else:
            rot = self.rotations(h, d, nb, qk.device, qk.dtype)
            buckets = torch.cat(
                [
                    hash_rounds(qk.detach(), rot[:, :, s:e], nb)
                    for s, e in round_groups(r, self.cfg.rounds_per_pass)
                ],
                dim=2,
            )
        real = torch.arange(length, device=qk.device) < n
        if key_padding_mask is not None:
            real = (
                real
                & torch.nn.functional.pad(key_padding_mask, (0, length - n), value=False)[
                    :, None, None
                ]
            )
        return torch.where(real, buckets, total_buckets(nb))  # padding: one extra, last bucket

    def attend(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        _b, _h, n, _d = q.shape
        cfg = self.cfg
        c = cfg.chunk_length
        npad = padded_length(n, c)
        if npad != n:  # pad to whole chunks; padding hashes to the extra bucket and sorts last
            shared = k is q
            q, k, v = (torch.nn.functional.pad(t, (0, 0, 0, npad - n)) for t in (q, k, v))
            k = q if shared else k
        with torch.no_grad():
            perm, sorted_buckets = sort_by_bucket(self._hash(k, n, key_padding_mask))
        plan = LSHPlan(
            chunk=c,
            before=cfg.num_chunks_before,
            after=0 if self.causal else cfg.num_chunks_after,
            causal=self.causal,
            hf=cfg.hf_chunking,
            groups=round_groups(cfg.num_hashes, cfg.rounds_per_pass),
            perm=perm,
            sorted_buckets=sorted_buckets,
        )
        if resolve_kernel(cfg.kernel, q.device, q.dtype) == "flash":
            # shared QK goes in once (k=None): one tensor as two inputs is an autograd edge case
            out = LSHFlash.apply(q, None if k is q else k, v, plan)
        else:
            out = lsh_math(q, k, v, plan)
        return out[:, :, :n]
