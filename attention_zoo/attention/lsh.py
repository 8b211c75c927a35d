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
from typing import ClassVar

import torch
from torch import Tensor

from ..errors import OptionError
from ..rng import record_rng, replay_rng
from .base import AttentionCore, check_dropout, check_semantics, semantics_caps
from .decode import (
    CACHED,
    CACHED_HF,
    DecodeState,
    KVCache,
    StateShape,
    append,
    kv_cache,
    kv_cache_bytes,
)
from .dispatch import Call, Implementation, KernelTable, cpu_fused, materialised
from .kernels.chunked import padded_length, padded_qkv
from .kernels.compiled import maybe_compiled
from .kernels.dense import dense_attention, unit_keys
from .kernels.flex import (
    BlockMask,
    chunk_window_tiles,
    flex_dtype,
    flex_environment,
    structural_block_mask,
)
from .kernels.masks import mask_value, real_positions, self_mask_value
from .kernels.rounds.circular import (
    HF_KEY_EPS,
    CircularPlan,
    circular_math,
    consecutive_reason,
    hf_keys,
)
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
from .kernels.rounds.lsh_plan import LSHPlan, with_self
from .options import check_chunking, check_int
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
    # hf (its chunk-aligned windows need a larger mask per round)
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
        return semantics_caps(caps, self.semantics, exactly_causal=False)


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

    def capture_obstacle(self, call: Call, mode: str) -> str | None:
        """Seeded rotations come from a generator seeded on the host every call, and a prefill
        draws its rotations again by setting the RNG state on the host. An exact decode step
        draws none: it hashes with the rotations its state keeps."""
        if mode == "prefill":
            return "its prefill sets the RNG state on the host to draw its rotations again"
        if self.cfg.seed is None or (mode == "decode" and self.cfg.semantics == "exact"):
            return None
        return (
            "its seeded rotations come from a generator seeded on the host every call (leave "
            "seed unset to draw them from the global RNG, which a graph replays)"
        )

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
            allowed = self.allowed(q, key_padding_mask)
            keys = hf_keys(k)
            return dense_attention(
                q, keys, v, allowed, scale=1.0, penalise_self=True, dropout=dropout
            )
        npad = padded_length(n, c)
        # whole chunks: padding hashes to the extra bucket and sorts last
        q, k, v = padded_qkv(q, k, v, npad)
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
                key_real=real_positions(n, npad, key_padding_mask, q.device).expand(b, npad),
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

    # ---- decoding ------------------------------------------------------------------------------
    # exact: per round, a ring of the chunk_length * num_chunks_before latest keys of each bucket
    # (a query sees nothing else), so the state and a step's cost are bounded; hf: every key,
    # value and bucket per round, read as transformers' LSHSelfAttention reads its cache.

    @staticmethod
    def decoding(cfg: LSHConfig) -> str:
        return CACHED_HF if cfg.semantics == "hf" else CACHED

    def ring_size(self) -> int:
        """Earlier keys of its bucket a query may see in a round (exact semantics, causal)."""
        return self.cfg.chunk_length * self.cfg.num_chunks_before

    def _sized(self, max_length: int) -> LSHAttention:
        """The core whose bucket count the state uses: this one when num_buckets or max_length
        fixes it, else one sized for max_length (the forward sizes it from its length)."""
        if self.cfg.num_buckets is not None or self.cfg.max_length is not None:
            return self
        return LSHAttention(dataclasses.replace(self.cfg, max_length=max_length), causal=True)

    def init_state(self, shape: StateShape) -> DecodeState:
        s, device = shape, torch.device(shape.device)
        nb = self._sized(s.max_length).buckets_for(s.max_length)
        r = self.cfg.num_hashes
        if self.cfg.semantics == "hf":
            buckets = s.tensor(s.batch, s.heads, r, s.max_length, dtype=torch.long)
            return kv_cache(s, LSHCache, buckets=buckets, hashed=False, nb=nb)
        rings = (s.batch, s.heads, r, total_buckets(nb) + 1, self.ring_size(), s.head_dim)
        return LSHRings(
            shape=s,
            rotations=self.rotations(s.heads, s.head_dim, nb, device, s.dtype),
            keys=s.tensor(*rings),
            values=s.tensor(*rings),
            count=s.tensor(*rings[:4], dtype=torch.long),
            nb=nb,
        )

    def state_bytes(self, shape: StateShape) -> int:
        s, r = shape, self.cfg.num_hashes
        nb = self._sized(s.max_length).buckets_for(s.max_length)
        if self.cfg.semantics == "hf":
            return kv_cache_bytes(s) + s.batch * s.heads * r * s.max_length * 8
        slots = s.batch * s.heads * r * (total_buckets(nb) + 1)
        rotations = s.heads * s.head_dim * r * rotation_width(nb) * s.itemsize()
        return rotations + slots * (2 * self.ring_size() * s.head_dim * s.itemsize() + 8)

    def step(
        self, q: Tensor, k: Tensor, v: Tensor, state: DecodeState, key_padding_mask: Tensor | None
    ) -> tuple[Tensor, DecodeState]:
        """New tokens against the state (see attention/decode.py); the prefill is the forward.
        After it, tokens go one at a time: a token's bucket may hold the tokens just before it."""
        if state.length == 0:
            return self._prefill(q, k, v, state, key_padding_mask)
        one = self._step_exact if isinstance(state, LSHRings) else self._step_hf
        outs = []
        for i in range(q.shape[2]):  # the new tokens: a few at most
            mask = None if key_padding_mask is None else key_padding_mask[:, i : i + 1]
            token = (t[:, :, i : i + 1] for t in (q, k, v))
            out, state = one(*token, state, mask)
            outs.append(out)
        return torch.cat(outs, dim=2), state

    def _prefill(
        self, q: Tensor, k: Tensor, v: Tensor, state: DecodeState, key_padding_mask: Tensor | None
    ) -> tuple[Tensor, DecodeState]:
        """The forward over the prompt, then its buckets hashed with the forward's rotations
        (unseeded: the RNG replayed to draw them again)."""
        n = q.shape[2]
        core = self._sized(state.shape.max_length)
        rng = record_rng(q.device)
        out = core.attend(q, k, v, key_padding_mask)
        # HF's prefill hashes nothing when the prompt fits one chunk
        buckets = None
        if not (isinstance(state, LSHCache) and n <= self.cfg.chunk_length):
            with replay_rng(rng), torch.no_grad():  # the forward's draw again
                buckets = core._hash(k, n, key_padding_mask)
        if isinstance(state, LSHCache):
            state = append(state, k, v, key_padding_mask)
            if buckets is not None:
                padded = key_padding_mask is not None and (~key_padding_mask).any()
                state = state.with_buckets(buckets, padded)
            return out, state
        with replay_rng(rng):
            rotations = core.rotations(q.shape[1], q.shape[3], state.nb, q.device, q.dtype)
        state = dataclasses.replace(state, rotations=rotations)
        return out, state.filled(unit_keys(k), v, buckets)

    def _bucket(self, x: Tensor, rotations: Tensor, nb: Buckets) -> Tensor:
        """Buckets (b, h, r, t) of x (b, h, t, d), every round at once."""
        if total_buckets(nb) == 1:
            return x.new_zeros((*x.shape[:2], self.cfg.num_hashes, x.shape[2]), dtype=torch.long)
        return hash_rounds(x, rotations, nb)

    def _step_exact(
        self, q: Tensor, k: Tensor, v: Tensor, state: LSHRings, key_padding_mask: Tensor | None
    ) -> tuple[Tensor, LSHRings]:
        """One token: per round, its bucket's ring (the latest keys of its bucket), self apart."""
        rounds = self.cfg.num_hashes
        bucket = self._bucket(k, state.rotations, state.nb)[..., 0]  # (b, h, r)
        if key_padding_mask is not None:
            bucket = torch.where(key_padding_mask[:, None, None, 0], bucket, state.padding_bucket)
        size = self.ring_size()
        if size:
            keys, values, seen = state.ring(bucket)  # (b, h, r, C, d) x2, (b, h, r, C)
            scores = torch.einsum("bhd,bhrcd->bhrc", q[:, :, 0], keys)
            scores = scores.masked_fill(~seen, mask_value(scores.dtype))
            lse_r = torch.logsumexp(scores, dim=-1)  # (b, h, r)
            out_r = torch.einsum("bhrc,bhrcd->bhrd", torch.softmax(scores, dim=-1), values)
            lse = torch.logsumexp(lse_r, dim=2)
            out = (out_r * torch.exp(lse_r - lse[..., None])[..., None]).sum(2)  # round weights
        else:  # no earlier key is ever seen: the token attends to itself
            out = torch.zeros_like(q[:, :, 0])
            lse = torch.full_like(q[:, :, 0, 0], mask_value(q.dtype))
        out = with_self(out[:, :, None], lse[:, :, None], v, rounds)[0]
        return out, state.added(bucket, unit_keys(k), v)

    def _step_hf(
        self, q: Tensor, k: Tensor, v: Tensor, state: LSHCache, key_padding_mask: Tensor | None
    ) -> tuple[Tensor, LSHCache]:
        """One token as HF's cached LSHSelfAttention: its bucket appended to the cached ones of
        each round, their stable sort, and the new token's chunk window in it (plus `before`
        chunks back, wrapping around) as its keys; HF's keys, self value and round weights. Before
        the sequence passes one chunk (no buckets yet), every cached key; then all are hashed."""
        start = state.length
        state = append(state, k, v, key_padding_mask)
        n = state.length
        cfg, c = self.cfg, self.cfg.chunk_length
        b, h, _, d = q.shape
        if not state.hashed:
            keys, values = hf_keys(state.keys()), state.values()  # (b, h, n, d)
            positions = torch.arange(n, device=q.device)
            real = state.real_keys()[:, None, None, :]  # (b, 1, 1, n)
            scores = torch.matmul(q, keys.transpose(-1, -2))  # (b, h, 1, n)
            scores = scores.masked_fill(~real, mask_value(scores.dtype))
            scores = scores.masked_fill(positions == start, self_mask_value(scores.dtype))
            out = torch.matmul(torch.softmax(scores, dim=-1), values)
            if n >= c:  # HF hashes every cached key once the sequence reaches a chunk
                rotations = self.rotations(h, d, state.nb, q.device, q.dtype)
                buckets = self._bucket(state.keys(), rotations, state.nb)
                real_all = state.real_keys()[:, None, None, :]
                buckets = torch.where(real_all, buckets, total_buckets(state.nb))
                padded = state.masked and (~state.real_keys()).any()
                state = state.with_buckets(buckets, padded)
            return out, state
        rounds, total = cfg.num_hashes, total_buckets(state.nb)
        past = state.buckets[..., :start]  # (b, h, r, start), with HF's round offsets
        # HF widens the new token's offsets when the cache holds padding's extra bucket
        wide = (past.max() > rounds * total - 1).long()
        offsets = torch.arange(rounds, device=q.device) * (total + wide)
        rotations = self.rotations(h, d, state.nb, q.device, q.dtype)
        new = self._bucket(k, rotations, state.nb)[..., 0] + offsets  # (b, h, r)
        order = torch.sort(torch.cat([past, new[..., None]], dim=-1), dim=-1, stable=True)[1]
        rank = (past <= new[..., None]).sum(-1)  # the new token's slot in the sorted order
        width = (cfg.num_chunks_before + cfg.num_chunks_after + 1) * c
        first = (rank // c - cfg.num_chunks_before) * c
        slots = (first[..., None] + torch.arange(width, device=q.device)) % n  # (b, h, r, W)
        positions = order.gather(-1, slots)
        flat = positions.flatten(2)[..., None].expand(-1, -1, -1, d)
        keys = hf_keys(state.k.gather(2, flat)).view(b, h, rounds, width, d)
        values = state.v.gather(2, flat).view(b, h, rounds, width, d)
        scores = torch.einsum("bhd,bhrwd->bhrw", q[:, :, 0], keys)
        real = state.real[:, None, None, :].expand(b, h, rounds, -1).gather(-1, positions)
        scores = scores.masked_fill(~real, mask_value(scores.dtype))
        scores = scores.masked_fill(positions == start, self_mask_value(scores.dtype))
        lse_r = torch.logsumexp(scores, dim=-1)  # (b, h, r)
        out_r = torch.einsum("bhrw,bhrwd->bhrd", torch.softmax(scores, dim=-1), values)
        out = (out_r * torch.softmax(lse_r, dim=-1)[..., None]).sum(2)  # HF's round weights
        state.buckets[..., start] = new
        return out[:, :, None], state

    def _flex(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        """Exact semantics through FlexAttention: every round sorted side by side, one call;
        hashing, sorting, attention and the merge compiled as one function on CUDA."""
        n = q.shape[2]
        cfg, causal = self.cfg, self.causal
        c = cfg.chunk_length
        npad = padded_length(n, c)
        # whole chunks: padding hashes to the extra bucket and sorts last
        q, k, v = padded_qkv(q, k, v, npad)
        nb, rot = self._rotations_for(k, n, key_padding_mask)  # drawn here: RNG state replays
        after = 0 if causal else cfg.num_chunks_after
        length = cfg.num_hashes * npad
        key = ("rounds", length, str(q.device))
        if key not in self._block_masks:  # the sorted sequence's chunk windows, per length
            tiles = chunk_window_tiles(length, c, cfg.num_chunks_before, after, causal, q.device)
            self.keep_block_mask(key, structural_block_mask(tiles, length))
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
    real = real_positions(n, length, key_padding_mask, qk.device)[:, None, None]
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


HF_ROUNDS_PER_PASS = 2  # a lower peak than all rounds at once


@dataclass(frozen=True, kw_only=True)
class LSHRings(DecodeState):
    """Exact semantics: per round and bucket (and one for padding), the latest ring-size unit keys
    and their values, (b, h, r, buckets + 1, C, d), and how many keys each bucket got; the
    rotations (h, d, r, k) every token is hashed with."""

    rotations: Tensor
    keys: Tensor
    values: Tensor
    count: Tensor  # (b, h, r, buckets + 1) long
    nb: Buckets
    uncapturable: ClassVar[str] = ""  # rings and counts written in place, on the device

    @property
    def padding_bucket(self) -> int:
        return total_buckets(self.nb)

    def truncated(self, n: int) -> LSHRings:
        """Padding went to the padding bucket's ring, which no real token reads."""
        return dataclasses.replace(self, length=n)

    def ring(self, bucket: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The ring of `bucket` (b, h, r) in each round: keys, values (b, h, r, C, d) and which
        of its C slots hold a key (b, h, r, C)."""
        size, d = self.keys.shape[-2:]
        index = bucket[..., None, None, None].expand(-1, -1, -1, 1, size, d)
        keys = self.keys.gather(3, index).squeeze(3)
        values = self.values.gather(3, index).squeeze(3)
        got = self.count.gather(3, bucket[..., None])  # (b, h, r, 1)
        return keys, values, torch.arange(size, device=got.device) < got

    def added(self, bucket: Tensor, key: Tensor, value: Tensor) -> LSHRings:
        """One token's unit key and value (b, h, 1, d) written (in place) into the ring of its
        bucket (b, h, r) in every round, over the oldest key there."""
        b, h, r = bucket.shape
        size, d = self.keys.shape[-2:]
        if size:
            slot = bucket * size + self.count.gather(3, bucket[..., None])[..., 0] % size
            index = slot[..., None, None].expand(-1, -1, -1, 1, d)
            for ring, x in ((self.keys, key), (self.values, value)):
                source = x[:, :, None].expand(b, h, r, 1, d)
                ring.view(b, h, r, -1, d).scatter_(3, index, source)
        self.count.scatter_add_(3, bucket[..., None], torch.ones_like(bucket[..., None]))
        return dataclasses.replace(self, length=self.length + 1)

    def filled(self, keys: Tensor, values: Tensor, buckets: Tensor) -> LSHRings:
        """The state after a prompt: keys, values (b, h, n, d) and their buckets (b, h, r, n); each
        bucket's latest keys in ring slots rank % C, as later steps write them."""
        b, h, r, n = buckets.shape
        slots, size, d = self.count.shape[-1], self.keys.shape[-2], keys.shape[-1]
        count = torch.zeros_like(self.count).scatter_add_(3, buckets, torch.ones_like(buckets))
        self.count.copy_(count)
        if size:
            perm, ordered = sort_by_bucket(buckets.clone())
            ordered = ordered.long()
            first = count.cumsum(-1) - count  # the first sorted slot of each bucket
            rank = torch.arange(n, device=keys.device) - first.gather(-1, ordered)
            keep = rank >= count.gather(-1, ordered) - size
            target = torch.where(keep, ordered * size + rank % size, slots * size)  # else: spare
            index = target[..., None].expand(-1, -1, -1, -1, d)
            for ring, x in ((self.keys, keys), (self.values, values)):
                source = (
                    x[:, :, None]
                    .expand(b, h, r, n, d)
                    .gather(3, perm[..., None].expand(-1, -1, -1, -1, d))
                )
                flat = x.new_zeros(b, h, r, slots * size + 1, d).scatter_(3, index, source)
                ring.copy_(flat[..., :-1, :].view(ring.shape))
        return dataclasses.replace(self, length=self.length + n)


@dataclass(frozen=True, kw_only=True)
class LSHCache(KVCache):
    """HF semantics: shared keys and values of every position (a KV cache) and their buckets per
    round (b, h, r, max_length) as HF caches them: with its round offsets r * (buckets + 1 when the
    prompt was padded, else buckets)."""

    buckets: Tensor
    hashed: bool  # buckets exist: HF hashes once the sequence is longer than one chunk
    nb: Buckets

    def with_buckets(self, buckets: Tensor, padded: Tensor | bool) -> LSHCache:
        """Buckets (b, h, r, length) of every position so far, offset per round as HF does."""
        rounds, total = buckets.shape[2], total_buckets(self.nb)
        wide = torch.as_tensor(padded, device=buckets.device).long()
        offsets = torch.arange(rounds, device=buckets.device) * (total + wide)
        self.buckets[..., : buckets.shape[-1]] = buckets + offsets[:, None]
        return dataclasses.replace(self, hashed=True)


def _exact(core: LSHAttention, call: Call) -> str | None:
    if core.cfg.semantics != "exact":
        return (
            "runs the exact semantics only (HF's windows wrap around the concatenated rounds "
            "with no bucket mask: cpu-fused or math)"
        )
    return None


def _consecutive(core: LSHAttention, call: Call) -> str | None:
    return consecutive_reason(core.cfg, call.length, core.cfg.num_hashes)


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
    {"cpu": ("cpu-fused", "math"), "cuda": ("flex", "math")},
)
LSHAttention.kernels = KERNELS
