"""Reformer LSH attention (Kitaev, Kaiser, Levskaya 2020), multi-round, exactly causal by default.

Angular LSH (Andoni et al. 2015) hashes each shared query/key into a bucket; positions are sorted by
(bucket, position) per round, the sorted sequence is cut into chunks, and each chunk attends to
itself and its neighbour chunks. Rounds are combined by their log-sum-exp weights.

`semantics="exact"` (default): only keys of the same bucket; causal: each query sees, within its
bucket, itself and at most chunk_length * num_chunks_before sorted predecessors -- a window no
future token can shift, so exactly causal.
`semantics="hf"`: transformers' LSHSelfAttention as it computes: no bucket mask, chunk windows that
wrap around the concatenation of all rounds, HF's key normalisation, masks and self value, its
rotation draw, and full shared-QK attention when the sequence fits one chunk. Causal masks by
position, but which past keys share a window depends on later tokens' buckets: not exactly causal.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from ..errors import OptionError
from .base import AttentionCore, check_dropout, check_semantics
from .kernels.chunked import check_chunking, check_int, cpu_fused, padded_length
from .kernels.compiled import maybe_compiled
from .kernels.dense import allowed_mask, dense_attention
from .kernels.dispatch import Call, Implementation, KernelTable, materialised
from .kernels.flex import (
    BlockMask,
    chunk_window_tiles,
    flex_dtype,
    flex_environment,
    structural_block_mask,
)
from .kernels.rounds.circular import HF_KEY_EPS, CircularPlan, circular_math, hf_keys
from .kernels.rounds.lsh_flex import lsh_flex
from .kernels.rounds.lsh_fused import RoundsFlash
from .kernels.rounds.lsh_hashing import (
    Buckets,
    auto_buckets,
    hash_rounds,
    rotation_width,
    round_groups,
    sort_by_bucket,
    total_buckets,
    validate_buckets,
)
from .kernels.rounds.lsh_math import lsh_math
from .kernels.rounds.lsh_plan import LSHPlan
from .spec import Capabilities, register_attention


@dataclass(frozen=True, kw_only=True)
class LSHConfig:
    """Options of LSH attention (names as Hugging Face's ReformerConfig where they exist)."""

    num_hashes: int = 1  # hash rounds, combined by log-sum-exp weights
    # int, or factors (a, b, ...) -> a*b*... buckets; None: HF's rule from max_length, else from
    # the sequence length (then a key_padding_mask is refused: padding would change the count)
    num_buckets: Buckets | None = None
    max_length: int | None = None  # longest sequence expected (HF: max_position_embeddings)
    chunk_length: int = 64  # positions per chunk of the sorted sequence
    num_chunks_before: int = 1  # previous chunks attended (exact causal: the look-back x chunk)
    num_chunks_after: int = 0  # following chunks attended (exact: ignored when causal)
    seed: int | None = None  # seeds the random rotations; None draws them from torch's global RNG
    semantics: str = "exact"  # exact (exactly causal) or hf (transformers' LSHSelfAttention)
    dropout: float = 0.0  # attention-probability dropout, in training mode only
    kernel: str = "auto"  # auto (the pick rule), cpu-fused, math, flex (exact semantics)
    # most hash rounds per fused forward pass (the backward takes at most one); None: as many as
    # fit the kernel's fixed working set (a long sequence's rounds go in slices), at most 2 for
    # hf (its chunk-aligned windows need a 1.6x larger mask per round)
    rounds_per_pass: int | None = None

    def __post_init__(self) -> None:
        check_chunking("lsh", self.chunk_length, self.num_chunks_before, self.num_chunks_after)
        KERNELS.check_option("lsh", self.kernel)
        check_int("num_hashes", self.num_hashes, minimum=1, backend="lsh")
        for name, least in (("rounds_per_pass", 1), ("max_length", 1), ("seed", 0)):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), minimum=least, backend="lsh")
        check_semantics("lsh", self.semantics)
        check_dropout("lsh", self.dropout)
        object.__setattr__(self, "num_buckets", validate_buckets(self.num_buckets))

    def capabilities(self, caps: Capabilities) -> Capabilities:
        """HF semantics: causal by position, but the buckets of later tokens move the windows."""
        if self.semantics == "hf":
            return dataclasses.replace(caps, exactly_causal=False)
        return caps


@register_attention(
    "lsh",
    config=LSHConfig,
    caps=Capabilities(shared_qk=True, exact=False, deterministic=False),
    variants=({"semantics": "hf"},),
)
class LSHAttention(AttentionCore):
    """Multi-round LSH attention on shared QK; O(n * hashes * chunk) memory, exactly causal."""

    def buckets_for(self, n: int) -> Buckets:
        """The bucket count at sequence length n: num_buckets, else HF's rule on max_length (or n,
        as given: never the length padded to whole chunks)."""
        cfg = self.cfg
        if cfg.num_buckets is not None:
            return cfg.num_buckets
        return auto_buckets(cfg.max_length or n, cfg.chunk_length, cfg.max_length)

    def rotations(
        self, heads: int, d: int, nb: Buckets, device: torch.device, dtype: torch.dtype
    ) -> Tensor:
        """Random rotations (h, d, r, k): global RNG unless seeded (RNG replay reproduces them).

        HF semantics draw as HF does, in the vectors' dtype (the same seed, the same rotations);
        exact semantics draw float32."""
        shape = (heads, d, self.cfg.num_hashes, rotation_width(nb))
        gen = None
        if self.cfg.seed is not None and device.type != "meta":
            gen = torch.Generator(device=device).manual_seed(self.cfg.seed)
        draw = dtype if self.cfg.semantics == "hf" else torch.float32
        return torch.randn(shape, generator=gen, device=device, dtype=draw).to(dtype)

    @torch.no_grad()
    def hash(self, qk: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """Buckets (b, h, r, n) of shared query/keys (b, h, n, d); padding gets the extra bucket."""
        return self._hash(qk, qk.shape[2], key_padding_mask)

    def _hash(self, qk: Tensor, n: int, key_padding_mask: Tensor | None) -> Tensor:
        """Buckets (b, h, r, len) of qk (b, h, len, d) whose first n positions are real."""
        cfg = self.cfg
        nb, rot = self._rotations_for(qk, n, key_padding_mask)
        groups = round_groups(cfg.num_hashes, cfg.rounds_per_pass)
        return lsh_buckets(qk, rot, nb, n, key_padding_mask, cfg.num_hashes, groups)

    def _rotations_for(
        self, qk: Tensor, n: int, key_padding_mask: Tensor | None
    ) -> tuple[Buckets, Tensor | None]:
        """(bucket count, random rotations (h, d, r, k), None for one bucket) of a call."""
        cfg = self.cfg
        if key_padding_mask is not None and cfg.num_buckets is None and cfg.max_length is None:
            raise OptionError(
                "lsh num_buckets=None sizes the buckets from the sequence length, which padding a "
                "batch changes; with a key_padding_mask give num_buckets, or max_length (the "
                "longest sequence, as HF's max_position_embeddings)"
            )
        nb = self.buckets_for(n)
        if nb == 1:
            return nb, None
        return nb, self.rotations(qk.shape[1], qk.shape[3], nb, qk.device, qk.dtype)

    def _sorted(
        self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None, fused: bool
    ) -> Tensor:
        """The round-sorted kernels: PyTorch's fused CPU op (fused) or materialised blocks."""
        b, _h, n, d = q.shape
        cfg = self.cfg
        c = cfg.chunk_length
        hf = cfg.semantics == "hf"
        dropout = self.dropout_p
        if hf and n <= c:  # HF: the sequence fits one chunk: full shared-QK attention
            allowed = allowed_mask(
                n, causal=self.causal, key_padding_mask=key_padding_mask, device=q.device
            )
            keys = hf_keys(k)
            return dense_attention(
                q, keys, v, allowed, scale=1.0, penalise_self=True, dropout=dropout
            )
        npad = padded_length(n, c)
        if npad != n:  # pad to whole chunks; padding hashes to the extra bucket and sorts last
            shared = k is q
            q, k, v = (torch.nn.functional.pad(t, (0, 0, 0, npad - n)) for t in (q, k, v))
            k = q if shared else k
        with torch.no_grad():
            perm, sorted_buckets = sort_by_bucket(self._hash(k, n, key_padding_mask))
        per_pass = cfg.rounds_per_pass or (HF_ROUNDS_PER_PASS if hf else None)
        groups = round_groups(cfg.num_hashes, per_pass)
        if hf:
            plan = CircularPlan(
                chunk=c,
                before=cfg.num_chunks_before,
                after=cfg.num_chunks_after,
                causal=self.causal,
                groups=groups,
                perm=perm,
                key_real=real_keys(n, npad, key_padding_mask, q.device).expand(b, npad),
                scale=1.0,
                key_eps=d * HF_KEY_EPS,
                self_partial=True,
            )
            math_path = functools.partial(circular_math, dropout=dropout)
        else:
            plan = LSHPlan(
                chunk=c,
                before=cfg.num_chunks_before,
                after=0 if self.causal else cfg.num_chunks_after,
                causal=self.causal,
                groups=groups,
                perm=perm,
                sorted_buckets=sorted_buckets,
            )
            math_path = functools.partial(lsh_math, dropout=dropout)
        if fused:  # shared QK goes in once (k=None): one tensor as two inputs is an edge case
            out = RoundsFlash.apply(q, None if k is q else k, v, plan)
        else:
            out = math_path(q, k, v, plan)
        return out[:, :, :n]

    def _flex(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        """Exact semantics through FlexAttention: every round sorted side by side, one call;
        hashing, sorting, attention and the merge compiled as one function on CUDA."""
        n = q.shape[2]
        cfg, causal = self.cfg, self.causal
        c = cfg.chunk_length
        npad = padded_length(n, c)
        if npad != n:  # pad to whole chunks; padding hashes to the extra bucket and sorts last
            shared = k is q
            q, k, v = (torch.nn.functional.pad(t, (0, 0, 0, npad - n)) for t in (q, k, v))
            k = q if shared else k
        nb, rot = self._rotations_for(k, n, key_padding_mask)  # drawn here: RNG state replays
        after = 0 if causal else cfg.num_chunks_after
        length = cfg.num_hashes * npad
        key = ("rounds", length, str(q.device))
        if key not in self._block_masks:  # the sorted sequence's chunk windows, per length
            tiles = chunk_window_tiles(length, c, cfg.num_chunks_before, after, causal, q.device)
            self._block_masks[key] = structural_block_mask(tiles, length)
        out = maybe_compiled(
            hashed_flex, q, k, v, rot, key_padding_mask, self._block_masks[key],
            n=n, nb=nb, rounds=cfg.num_hashes, chunk=c, before=cfg.num_chunks_before,
            after=after, causal=causal,
        )  # fmt: skip
        return out[:, :, :n]


def lsh_buckets(
    qk: Tensor,
    rot: Tensor | None,
    nb: Buckets,
    n: int,
    key_padding_mask: Tensor | None,
    rounds: int,
    groups: list[tuple[int, int]],
) -> Tensor:
    """Buckets (b, h, r, len) of qk (b, h, len, d) whose first n positions are real, hashed a
    group of rounds at a time; padding gets the extra, last bucket."""
    b, h, length, _ = qk.shape
    if rot is None:  # one bucket
        buckets = qk.new_zeros((b, h, rounds, length), dtype=torch.long)
    else:
        parts = [hash_rounds(qk.detach(), rot[:, :, s:e], nb) for s, e in groups]
        buckets = torch.cat(parts, dim=2)
    real = real_keys(n, length, key_padding_mask, qk.device)[:, None, None]
    return torch.where(real, buckets, total_buckets(nb))


def hashed_flex(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rot: Tensor | None,
    key_padding_mask: Tensor | None,
    structure: BlockMask,
    *,
    n: int,
    nb: Buckets,
    rounds: int,
    chunk: int,
    before: int,
    after: int,
    causal: bool,
) -> Tensor:
    """Hash every round, sort, attend through FlexAttention and merge: a function of tensors and
    constants only, so one compiled graph serves every module with these options."""
    with torch.no_grad():
        buckets = lsh_buckets(k, rot, nb, n, key_padding_mask, rounds, [(0, rounds)])
        perm, sorted_buckets = sort_by_bucket(buckets)
    return lsh_flex(
        q, k, v, perm, sorted_buckets, structure, chunk=chunk, before=before, after=after,
        causal=causal,
    )  # fmt: skip


HF_ROUNDS_PER_PASS = 2  # at L = 4096, 4 hashes: peak 0.24x HF's instead of 0.37x (all at once)


def real_keys(n: int, length: int, key_padding_mask: Tensor | None, device) -> Tensor:
    """(b | 1, length) bool: positions below n that the key_padding_mask (if any) calls real."""
    real = (torch.arange(length, device=device) < n)[None]
    if key_padding_mask is not None:
        padded = torch.nn.functional.pad(key_padding_mask, (0, length - n), value=False)
        real = real & padded
    return real


def _exact(core: LSHAttention, call: Call) -> str | None:
    if core.cfg.semantics != "exact":
        return (
            "runs the exact semantics only (HF's windows wrap around the concatenated rounds "
            "with no bucket mask: cpu-fused or math)"
        )
    return None


def _consecutive(core: LSHAttention, call: Call) -> str | None:
    """HF semantics: the fused kernel's buffers hold consecutive chunks only."""
    cfg = core.cfg
    if cfg.semantics != "hf" or call.length <= cfg.chunk_length:
        return None
    chunks = cfg.num_hashes * padded_length(call.length, cfg.chunk_length) // cfg.chunk_length
    if max(cfg.num_chunks_before, cfg.num_chunks_after) > chunks:
        return (
            f"HF-semantics windows reach past all {chunks} chunks of the rounds (HF clamps those "
            "offsets): materialised only"
        )
    return None


KERNELS = KernelTable(
    (
        cpu_fused(
            lambda core, *args: core._sorted(*args, fused=True),
            "PyTorch's fused CPU attention over bounded slices of the sorted rounds, merged "
            "online; backward slice by slice",
            (_consecutive,),
        ),
        materialised(
            lambda core, *args: core._sorted(*args, fused=False),
            "materialised chunk windows of the sorted rounds with autograd",
        ),
        Implementation(
            name="flex",
            summary="FlexAttention over every round's sorted slots side by side, block lists "
            "from the chunk structure, rounds merged by log-sum-exp (compiled on CUDA)",
            run=LSHAttention._flex,
            devices=frozenset({"cpu", "cuda"}),
            environment=flex_environment,
            checks=(_exact, flex_dtype),
        ),
    ),
    {"cpu": ("cpu-fused", "math"), "meta": ("cpu-fused", "math"), "cuda": ("flex", "math")},
)
LSHAttention.kernels = KERNELS
