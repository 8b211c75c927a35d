"""Incremental decoding: a causal core's state, fed one or a few new tokens at a time.

A core that decodes defines AttentionCore's decoding contract (base.py; its types in state.py):
`init_state(shape) -> state` (a `StateShape`: batch, heads, head_dim, max_length, dtype, device,
kv_heads, value_dim), `state_bytes(shape) -> int` (its formula) and
`step(q, k, v, state, key_padding_mask=None, **extras) -> (out, state)`: q, k, v
and the extras its input layout declares are the t new tokens, out their outputs; a step on an
empty state is the prefill (the core's forward over the prompt, and the state built from it).
What a backend's decoding is, readable without building it (`decoding_of`):
  cached     its own state; prefill + steps equal the causal forward over the whole sequence
  cached-hf  its own state following transformers' cached generation (which differs from HF's
             own forward: windows chosen for the new token only)
  recompute  no state of its own: every step runs the forward over the whole prefix again and
             keeps the new tokens' outputs (the default, e.g. a plugin core)
  none       bidirectional only: a token's output would depend on later tokens

States are frozen dataclasses of tensors; a step returns the next state. A KV cache is
preallocated to `max_length` positions and written in place: appending a token then costs its
own bytes (growing by concatenation would copy the whole cache every token: reading and writing
it again, more bytes than the attention itself reads), and an earlier state stays valid for the
positions it holds (a KV cache only appends). Bounded states (windows, running sums,
bucket rings) are also written in place: a state is used once, then its successor.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..errors import InputError, OptionError, ShapeError
from .base import AttentionCore, check_key_padding_mask, check_qkv
from .kernels.autocast import autocast_dtype, in_dtype
from .kernels.dense import dense_attention
from .kernels.masks import MaskMod, real_keys
from .kernels.routing.route import block_means
from .kernels.segments import SEGMENT_LENGTH
from .kernels.sums.plain import compute_dtype
from .spec import BackendSpec, backends_where
from .state import (
    CACHED,
    CACHED_HF,
    DECODING_TEXT,
    DECODINGS,
    NONE,
    RECOMPUTE,
    DecodeState,
    StateShape,
)


def decoding_of(spec: BackendSpec, **options: Any) -> str:
    """How `spec` decodes with these options (one of DECODINGS), without building it: `none` when
    it cannot run causally, `recompute` when its class has no `init_state`, else what its class's
    `decoding(cfg)` says (AttentionCore's: `cached`)."""
    caps = spec.caps_for(**options) if options else spec.caps  # no config built for defaults
    if not caps.causal:
        return NONE
    if spec.cls.init_state is None:
        return RECOMPUTE
    return spec.cls.decoding(spec.make_config(**options))


def refusal(name: str) -> str:
    """The one line a bidirectional-only backend answers when asked to decode."""
    causal = ", ".join(backends_where(lambda s: s.caps.causal))
    return (
        f"backend {name!r} cannot decode token by token: it is bidirectional only (every output "
        f"mixes later tokens); decode with a causal backend: {causal}"
    )


@dataclass(frozen=True, kw_only=True)
class KVCache(DecodeState):
    """Keys and values of every position so far, preallocated: (b, kv, max_length, d) and
    (b, kv, max_length, d_v), and which keys are real (b, max_length)."""

    k: Tensor
    v: Tensor
    real: Tensor
    masked: bool = False  # some key was given as padding (else the real mask is all True)
    appends_only: ClassVar[bool] = True
    uncapturable: ClassVar[str] = (
        "attends over the cache up to the host's count of positions, a shape that grows every "
        "token (a plain one read by positions from the cache has a form counted on the device)"
    )

    def keys(self) -> Tensor:
        return self.k[:, :, : self.length]

    def values(self) -> Tensor:
        return self.v[:, :, : self.length]

    def real_keys(self) -> Tensor:
        return self.real[:, : self.length]

    def key_positions(self) -> Tensor:
        """(keys,) the position of each key keys() returns."""
        return torch.arange(self.length, device=self.k.device)

    def new_positions(self, t: int) -> Tensor:
        """(t,) the positions of the t tokens appended last."""
        return torch.arange(self.length - t, self.length, device=self.k.device)

    def appended(self, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> KVCache:
        """The cache with k, v (b, h, t, d) written at its end (in place), t positions longer."""
        start, t = self.length, k.shape[2]
        self.k[:, :, start : start + t] = k
        self.v[:, :, start : start + t] = v
        self.real[:, start : start + t] = True if key_padding_mask is None else key_padding_mask
        masked = self.masked or key_padding_mask is not None
        return dataclasses.replace(self, length=start + t, masked=masked)

    def truncated(self, n: int) -> KVCache:
        if not 0 <= n <= self.length:
            raise InputError(f"cannot truncate a state of {self.length} positions to {n}")
        return dataclasses.replace(self, length=n)


@dataclass(frozen=True, kw_only=True)
class StaticKVCache(KVCache):
    """A KV cache whose count of positions is on the device (`filled`, 0-d long): a step writes
    and reads it where no host value says, so a CUDA graph can replay it. Its keys are the whole
    buffers, those past the count masked."""

    filled: Tensor
    masked: bool = True  # the real mask is what hides the positions not yet written
    uncapturable: ClassVar[str] = ""
    appends_only: ClassVar[bool] = False  # its count is shared: an earlier state sees later ones

    def keys(self) -> Tensor:
        return self.k

    def values(self) -> Tensor:
        return self.v

    def real_keys(self) -> Tensor:
        return self.real & (self.key_positions() < self.filled)

    def key_positions(self) -> Tensor:
        return torch.arange(self.shape.max_length, device=self.k.device)

    def new_positions(self, t: int) -> Tensor:
        return self.filled - t + torch.arange(t, device=self.k.device)

    def appended(self, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> StaticKVCache:
        t = k.shape[2]
        at = self.filled + torch.arange(t, device=k.device)
        real = k.new_ones(k.shape[0], t, dtype=torch.bool)
        self.k.index_copy_(2, at, k)
        self.v.index_copy_(2, at, v)
        self.real.index_copy_(1, at, real if key_padding_mask is None else key_padding_mask)
        self.filled.add_(t)
        return dataclasses.replace(self, length=self.length + t)

    def truncated(self, n: int) -> StaticKVCache:
        raise InputError("a KV cache counted on the device cannot be truncated; truncate first")


def static_cache(cache: KVCache) -> StaticKVCache:
    """`cache`'s buffers with its count of positions on the device (StaticKVCache)."""
    if type(cache) is not KVCache:  # a subclass's own fields would be lost
        raise TypeError(f"static_cache takes a plain KVCache, not a {type(cache).__name__}")
    filled = torch.tensor(cache.length, device=cache.k.device)
    fields = {f.name: getattr(cache, f.name) for f in dataclasses.fields(KVCache)}
    return StaticKVCache(**{**fields, "masked": True, "filled": filled})


def capturable_state(core: AttentionCore, state: DecodeState) -> DecodeState | None:
    """`state`, or a form of it on the same buffers, whose steps by `core` a CUDA graph can
    replay (a plain KV cache of a core that reads positions from it: counted on the device);
    None when it has none (see the state's `uncapturable`)."""
    if type(state) is KVCache:
        return static_cache(state) if type(core).cache_positions else None
    return None if type(state).uncapturable else state


Cache = TypeVar("Cache", bound=KVCache)


def kv_cache(
    shape: StateShape, cls: type[Cache] = KVCache, *, capacity: int | None = None, **more: Any
) -> Cache:
    """An empty KV cache for max_length positions (its buffers `capacity` long, default
    max_length); a state that extends it (`cls`) is made the same way, with its `more` fields."""
    s, n = shape, capacity or shape.max_length
    return cls(
        shape=s,
        k=s.tensor(s.batch, s.kv, n, s.head_dim),
        v=s.tensor(s.batch, s.kv, n, s.dv),
        real=s.tensor(s.batch, n, dtype=torch.bool),
        **more,
    )


def kv_cache_bytes(shape: StateShape, *, capacity: int | None = None) -> int:
    """kv_cache's bytes by formula: b kv capacity (d + d_v) values and b capacity bools (capacity
    default max_length): shared KV heads divide it by the group."""
    s = shape
    return (s.kv * (s.head_dim + s.dv) * s.itemsize() + 1) * s.batch * (capacity or s.max_length)


def append(cache: Cache, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> Cache:
    """The cache with k, v (b, h, t, d) written at its end (in place) and t positions longer."""
    return cache.appended(k, v, key_padding_mask)


@dataclass(frozen=True, kw_only=True)
class BlocksState(KVCache):
    """A KV cache, the mean key of every complete block (b, kv, nb, d) in the score dtype, which
    blocks hold a real key (b, nb), and where a core pools values too, their means (b, kv, nb,
    d_v): the state of the cores that route queries to key blocks."""

    means: Tensor
    has: Tensor
    pooled_values: Tensor | None = None


def blocks_state(shape: StateShape, *, block: int, pool_values: bool = False) -> BlocksState:
    """An empty BlocksState for max_length positions in blocks of `block` keys; its cache holds
    whole blocks, so the kernels read it as blocks without a copy each step."""
    s, nb, wide = shape, -(-shape.max_length // block), compute_dtype(shape.dtype)
    return kv_cache(
        s,
        BlocksState,
        capacity=nb * block,
        means=s.tensor(s.batch, s.kv, nb, s.head_dim, dtype=wide),
        has=s.tensor(s.batch, nb, dtype=torch.bool),
        pooled_values=s.tensor(s.batch, s.kv, nb, s.dv, dtype=wide) if pool_values else None,
    )


def blocks_state_bytes(shape: StateShape, *, block: int, pool_values: bool = False) -> int:
    """blocks_state's bytes by formula: the KV cache, and per block its pooled widths and a bool."""
    s, nb = shape, -(-shape.max_length // block)
    pooled = s.kv * (s.head_dim + (s.dv if pool_values else 0)) * s.itemsize(compute_dtype(s.dtype))
    return kv_cache_bytes(s, capacity=nb * block) + s.batch * nb * (pooled + 1)


def blocks_append(
    state: BlocksState, k: Tensor, v: Tensor, key_padding_mask: Tensor | None, *, block: int
) -> BlocksState:
    """append, then pool the blocks these tokens complete (a partial block waits)."""
    start = state.length
    state = append(state, k, v, key_padding_mask)
    done, now = start // block, state.length // block
    if now > done:
        span = slice(done * block, now * block)
        real = state.real[:, span]
        state.means[:, :, done:now], state.has[:, done:now] = block_means(
            state.k[:, :, span], real, block
        )
        if state.pooled_values is not None:
            state.pooled_values[:, :, done:now] = block_means(state.v[:, :, span], real, block)[0]
    return state


def causal_allowed(cache: KVCache, t: int) -> Tensor | None:
    """(b | 1, 1, t, keys) bool: the last t positions of `cache` (just appended) see the keys
    before them, themselves and no later one, and only real ones; None when all are allowed."""
    allowed = None
    if t > 1:
        i = cache.new_positions(t)[:, None]
        allowed = (cache.key_positions()[None, :] <= i)[None, None]
    if cache.masked:
        real = cache.real_keys()[:, None, None, :]
        allowed = real if allowed is None else allowed & real
    return allowed


# SDPA's kernels for a step: all but cuDNN's, which plans anew for every key count it meets (a
# cost above the step's own, whatever the context).
STEP_SDPA_KERNELS = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)


def sdpa_attention(
    q: Tensor, keys: Tensor, values: Tensor, allowed: Tensor | None, *, scale: float | None = None
) -> Tensor:
    """dense_attention through F.scaled_dot_product_attention (its fused CPU and CUDA kernels)."""
    grouped = keys.shape[1] != q.shape[1]
    with sdpa_kernel(list(STEP_SDPA_KERNELS)):
        return F.scaled_dot_product_attention(
            q, keys, values, attn_mask=allowed, scale=scale, enable_gqa=grouped
        )


def kv_step(
    core: torch.nn.Module,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    state: KVCache,
    key_padding_mask: Tensor | None,
    attention: Callable[[Tensor, Tensor, Tensor, Tensor | None], Tensor],
) -> tuple[Tensor, KVCache]:
    """A full-attention core's step: k, v appended; the prefill is the core's forward, later
    tokens see every cached key through `attention(q, keys, values, allowed)`."""
    prefill = state.length == 0
    state = append(state, k, v, key_padding_mask)
    if prefill:
        return core.attend(q, k, v, key_padding_mask), state
    return attention(q, state.keys(), state.values(), causal_allowed(state, q.shape[2])), state


# ---- a bounded window: the first positions kept for ever, a ring of the latest ---------------


@dataclass(frozen=True, kw_only=True)
class WindowState(DecodeState):
    """Keys and values of the first `front` positions (global tokens) and a ring of the latest
    `size` others: slot p % size holds position p; pos (size,) says which (-1: empty)."""

    front_k: Tensor  # (b, kv, front, d)
    front_v: Tensor  # (b, kv, front, d_v)
    front_real: Tensor  # (b, front) bool
    k: Tensor  # (b, kv, size, d)
    v: Tensor  # (b, kv, size, d_v)
    real: Tensor  # (b, size) bool
    pos: Tensor  # (size,) long
    uncapturable: ClassVar[str] = "writes its ring at a slot the host computes from the position"


def window_state(shape: StateShape, *, size: int, front: int = 0) -> WindowState:
    """An empty window state: `front` first positions and a ring of `size` latest ones."""
    s = shape

    def keys(n: int, width: int) -> Tensor:
        return s.tensor(s.batch, s.kv, n, width)

    return WindowState(
        shape=s,
        front_k=keys(front, s.head_dim),
        front_v=keys(front, s.dv),
        front_real=s.tensor(s.batch, front, dtype=torch.bool),
        k=keys(size, s.head_dim),
        v=keys(size, s.dv),
        real=s.tensor(s.batch, size, dtype=torch.bool),
        pos=s.tensor(size, dtype=torch.long) - 1,
    )


def window_state_bytes(shape: StateShape, *, size: int, front: int = 0) -> int:
    """window_state's bytes by formula: independent of the context length."""
    s = shape
    return (s.kv * (s.head_dim + s.dv) * s.itemsize() + 1) * s.batch * (size + front) + 8 * size


def window_step(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    state: WindowState,
    key_padding_mask: Tensor | None,
    mod: MaskMod,
    *,
    scale: float,
) -> tuple[Tensor, WindowState]:
    """New tokens against the window and each other under the pattern `mod` (causality added);
    a query that sees no real key outputs zeros. Attends before it writes: a new token may take
    the ring slot of a key an earlier new token still sees."""
    start, t = state.length, q.shape[2]
    device = q.device
    new = torch.arange(start, start + t, device=device)
    fronts = torch.arange(state.front_k.shape[2], device=device)
    pos = torch.cat([fronts, state.pos, new])
    # front slots hold positions already seen; ring slots every other seen position
    filled = torch.cat([fronts < start, state.pos >= fronts.numel(), new >= 0])
    real = torch.cat(
        [state.front_real, state.real, real_keys(key_padding_mask, q.shape[0], t, device)], 1
    )
    i, j = new[:, None], pos[None, :]
    allowed = (mod(i, j) & (j <= i) & filled)[None, None] & real[:, None, None, :]
    keys = torch.cat([state.front_k, state.k, k], dim=2)
    values = torch.cat([state.front_v, state.v, v], dim=2)
    out = dense_attention(q, keys, values, allowed, scale=scale)
    out = out * allowed.any(-1, keepdim=True)
    return out, window_append(state, k, v, key_padding_mask)


def window_append(
    state: WindowState, k: Tensor, v: Tensor, key_padding_mask: Tensor | None
) -> WindowState:
    """The state with t new positions written (in place): the front ones among them, and the
    latest `size` into the ring."""
    start, t = state.length, k.shape[2]
    device = k.device
    real = real_keys(key_padding_mask, k.shape[0], t, device)
    front, size = state.front_k.shape[2], state.k.shape[2]
    if start < front:  # positions start .. min(start + t, front) - 1 are front ones
        stop = min(start + t, front)
        state.front_k[:, :, start:stop] = k[:, :, : stop - start]
        state.front_v[:, :, start:stop] = v[:, :, : stop - start]
        state.front_real[:, start:stop] = real[:, : stop - start]
    kept = min(t, size)
    if kept:
        positions = torch.arange(start + t - kept, start + t, device=device)
        slots = positions % size
        state.k.index_copy_(2, slots, k[:, :, t - kept :])
        state.v.index_copy_(2, slots, v[:, :, t - kept :])
        state.real.index_copy_(1, slots, real[:, t - kept :])
        state.pos.index_copy_(0, slots, positions)
    return dataclasses.replace(state, length=start + t)


# ---- running sums of kernelised attention -------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SumsState(DecodeState):
    """sum_j phi(k_j) [v_j, 1]^T over the positions seen: (b, h, m, d + 1) in the compute dtype
    (float32 for 16-bit inputs); constant size."""

    sums: Tensor
    uncapturable: ClassVar[str] = ""  # added to in place, whatever the position

    def truncated(self, n: int) -> SumsState:
        """Padding added nothing to the sums (its keys' features are zero): only the count."""
        return dataclasses.replace(self, length=n)


def sums_state(shape: StateShape, *, features: int) -> SumsState:
    """Zero sums over `features` features per head."""
    s, wide = shape, compute_dtype(shape.dtype)
    return SumsState(shape=s, sums=s.tensor(s.batch, s.heads, features, s.head_dim + 1, dtype=wide))


def sums_state_bytes(shape: StateShape, *, features: int) -> int:
    """sums_state's bytes by formula: independent of the context length."""
    s = shape
    return s.batch * s.heads * features * (s.head_dim + 1) * s.itemsize(compute_dtype(s.dtype))


def sums_add(state: SumsState, k: Tensor, v: Tensor, feats: Any) -> SumsState:
    """The state with t new keys and values added (in place), a segment of positions at a time
    (no (t, m) feature tensor of a long prompt at once). feats: the call's feature maps
    (kernels/sums/scan.CallFeatures), its key padding mask over these t positions."""
    t = k.shape[2]
    for s in range(0, t, SEGMENT_LENGTH):  # static: from the shape
        e = min(s + SEGMENT_LENGTH, t)
        phi_k = feats.key(k[:, :, s:e], s, e)  # (b, h, e - s, m)
        state.sums.add_(torch.matmul(phi_k.transpose(-1, -2), _with_ones(v[:, :, s:e], feats)))
    return dataclasses.replace(state, length=state.length + t)


def sums_step(
    q: Tensor, k: Tensor, v: Tensor, state: SumsState, feats: Any, *, eps: float
) -> tuple[Tensor, SumsState]:
    """out_i = phi(q_i) S_i / (phi(q_i) z_i) for t new tokens: the sums so far plus the new
    keys up to each query (a (t, t) lower triangle)."""
    d, t = q.shape[-1], q.shape[2]
    phi_q, phi_k = feats.query(q), feats.key(k, 0, t)
    vx = _with_ones(v, feats)
    y = torch.matmul(phi_q, state.sums)
    y = y + torch.matmul(torch.matmul(phi_q, phi_k.transpose(-1, -2)).tril_(), vx)
    out = y[..., :d] / (y[..., d:] + eps)
    state.sums.add_(torch.matmul(phi_k.transpose(-1, -2), vx))
    return out.to(q.dtype), dataclasses.replace(state, length=state.length + t)


def _with_ones(v: Tensor, feats: Any) -> Tensor:
    """[v, 1] in the compute dtype: one product gives both sum_j a_j v_j and sum_j a_j."""
    v = v.to(feats.wide)
    return torch.cat([v, v.new_ones(*v.shape[:-1], 1)], dim=-1)


# ---- the default: recompute the whole prefix --------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RecomputeState(KVCache):
    """The prefix's queries (b, h, max_length, d) and extra inputs too: a core without a state of
    its own runs its forward over all of them every step."""

    q: Tensor
    extras: dict[str, Tensor] = dataclasses.field(default_factory=dict)  # (b, h, max_length, *)


def recompute_state(shape: StateShape) -> RecomputeState:
    s = shape
    return kv_cache(s, RecomputeState, q=s.tensor(s.batch, s.heads, s.max_length, s.head_dim))


def recompute_step(
    core: AttentionCore,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    state: RecomputeState,
    key_padding_mask: Tensor | None,
    extras: dict[str, Tensor],
) -> tuple[Tensor, RecomputeState]:
    start, t = state.length, q.shape[2]
    state.q[:, :, start : start + t] = q
    kept = state.extras
    if extras and not kept:  # buffers for the extras, made at the first call that has them
        s = state.shape
        kept = {
            name: x.new_zeros(s.batch, s.heads, s.max_length, *x.shape[3:])
            for name, x in extras.items()
        }
    for name, x in extras.items():
        kept[name][:, :, start : start + t] = x
    state = dataclasses.replace(append(state, k, v, key_padding_mask), extras=kept)
    n = state.length
    keys = state.q[:, :, :n] if core.layout.shared_qk else state.keys()
    mask = state.real_keys() if state.masked else None
    prefix = {name: x[:, :, :n] for name, x in kept.items()}
    out = core(state.q[:, :, :n], keys, state.values(), mask, **prefix)
    return out[:, :, start:], state


# ---- what callers use -------------------------------------------------------------------------


def init_state(core: AttentionCore, shape: StateShape, *, recompute: bool = False) -> DecodeState:
    """An empty state of `core` for `shape`: the core's own, or (no init_state, or
    recompute=True) the prefix kept to recompute the forward over every step.

    Raises OptionError for a core that cannot decode (bidirectional) or is not causal."""
    spec = core.spec
    if not getattr(core, "causal", spec.caps.causal):
        reason = refusal(spec.name) if not spec.caps.causal else "build it with causal=True"
        raise OptionError(f"decoding needs a causal core: {reason}")
    n = shape.max_length
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise OptionError(f"max_length must be an int >= 1 (positions to hold), got {n!r}")
    return (recompute_state if recompute or core.init_state is None else core.init_state)(shape)


def step(
    core: AttentionCore,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    state: DecodeState,
    key_padding_mask: Tensor | None = None,
    **extras: Tensor,
) -> tuple[Tensor, DecodeState]:
    """The outputs (b, h, t, d_v) of t new tokens (q, k, v and the core's extras, as its input
    layout declares) against `state`, and the state after them; key_padding_mask (b, t) bool,
    True = real token; under autocast, computed in the state's dtype with autocast off."""
    check_qkv(q, k, v, key_padding_mask, getattr(core, "layout", None), extras)
    s = state.shape
    if autocast_dtype(q) is not None:
        q, k, v, extras = in_dtype(s.dtype, q, k, v, extras)
        with torch.autocast(q.device.type, enabled=False):
            return step(core, q, k, v, state, key_padding_mask, **extras)
    if q.dtype != s.dtype:
        raise ShapeError(
            f"new tokens of dtype {q.dtype} against a state made for {s.dtype} (a state made "
            f"under autocast takes its dtype); make the state with dtype={q.dtype}"
        )
    b, h, t, d = q.shape
    got = (b, h, d, k.shape[1], v.shape[-1])
    if got != (s.batch, s.heads, s.head_dim, s.kv, s.dv):
        raise ShapeError(
            f"new tokens of (batch, heads, head_dim, kv_heads, value_dim) = {got} against a "
            f"state made for {(s.batch, s.heads, s.head_dim, s.kv, s.dv)}"
        )
    if state.length + t > s.max_length:
        raise InputError(
            f"{t} new tokens after {state.length} overflow the state's max_length="
            f"{s.max_length}; make the state with max_length >= {state.length + t}"
        )
    check_key_padding_mask(key_padding_mask, b, t)
    if isinstance(state, RecomputeState):
        return recompute_step(core, q, k, v, state, key_padding_mask, extras)
    return core.step(q, k, v, state, key_padding_mask, **extras)


__all__ = [
    "CACHED",
    "CACHED_HF",
    "DECODINGS",
    "DECODING_TEXT",
    "NONE",
    "RECOMPUTE",
    "DecodeState",
    "KVCache",
    "RecomputeState",
    "StateShape",
    "SumsState",
    "WindowState",
    "append",
    "causal_allowed",
    "decoding_of",
    "init_state",
    "kv_cache",
    "kv_cache_bytes",
    "kv_step",
    "refusal",
    "sdpa_attention",
    "step",
    "sums_add",
    "sums_state",
    "sums_state_bytes",
    "sums_step",
    "window_state",
    "window_state_bytes",
    "window_step",
]
