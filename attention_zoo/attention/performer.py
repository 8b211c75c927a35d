"""Performer attention, FAVOR+ (Choromanski et al. 2021): softmax attention estimated with positive
orthogonal random features, exp(q.k) ~ E[phi(q) . phi(k)], through linear attention's sums.

There is no `dropout` option: no attention probabilities exist to drop. The features are drawn
at the first forward (the head size is known then), seeded ones from a hash of (seed, index) in
tensor ops, so torch.compile(fullgraph=True) traces the draw. Key features
are exp(-|k - w|^2 / 2) <= 1: in float32 they underflow once |k - w|^2 passes ~170 (head sizes
well above 128); use float64 there.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from .base import AttentionCore
from .decode import StateShape, SumsState, sums_add, sums_state, sums_state_bytes, sums_step
from .kernels.sums.plain import FAVOR, KernelSums, compute_dtype
from .kernels.sums.scan import CallFeatures
from .kernels.sums.table import SUMS_KERNELS
from .options import check_flag, check_int
from .spec import Capabilities, register_attention


@dataclass(frozen=True, kw_only=True)
class PerformerConfig:
    """Options of Performer (FAVOR+) attention."""

    nb_features: int = 256  # random features m per head (the estimate's variance falls as 1/m)
    redraw: bool = False  # draw new features at every forward in training (global RNG)
    seed: int | None = None  # seeds the first draw; None draws it from torch's global RNG
    # causal: positions per chunk of the prefix sums; 128 (not linear's 64): with m = 4d features
    # the (n/c, m, d) chunk states and the c x c scores balance near c = sqrt(m d)
    chunk_length: int = 128
    kernel: str = "auto"  # auto (the pick rule), scan, math, fla (CUDA, causal)

    def __post_init__(self) -> None:
        check_int("nb_features", self.nb_features, minimum=1, backend="performer")
        check_int("chunk_length", self.chunk_length, minimum=1, backend="performer")
        SUMS_KERNELS.check_option("performer", self.kernel)
        if self.seed is not None:
            check_int("seed", self.seed, minimum=0, backend="performer")
        check_flag("performer", "redraw", self.redraw)

    def capabilities(self, caps: Capabilities) -> Capabilities:
        """Redrawn features make two training forwards differ."""
        return dataclasses.replace(caps, deterministic=not self.redraw)


_MASK32 = 0xFFFFFFFF


def _mul32(x: Tensor, factor: int) -> Tensor:
    """x * factor mod 2^32 for x < 2^32 held in int64, in 16-bit halves (no int64 overflow)."""
    low = x * (factor & 0xFFFF)
    high = ((x * (factor >> 16)) & 0xFFFF) << 16
    return (low + high) & _MASK32


def _hash32(x: Tensor) -> Tensor:
    """An avalanching 32-bit integer hash (Wellons' lowbias32) in tensor ops."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def counter_normal(seed: int, count: int, *, device: torch.device | str = "cpu") -> Tensor:
    """count standard normals (default dtype), each a function of (seed, its index) only:
    Box-Muller on two hashed uniforms. No torch.Generator: torch.compile(fullgraph=True) traces
    a seeded draw."""
    key = torch.tensor(seed % 2**32, dtype=torch.int64, device=device)  # a constant in graphs
    index = torch.arange(2 * count, dtype=torch.int64, device=device)
    bits = _hash32(_hash32(index) ^ _hash32(key ^ (seed >> 32) % 2**32))
    u = (bits.to(torch.float64) + 0.5) / 2**32  # in (0, 1): the log is finite
    radius = torch.sqrt(-2 * torch.log(u[:count]))
    return (radius * torch.cos(2 * torch.pi * u[count:])).to(torch.get_default_dtype())


def orthogonal_features(
    m: int, d: int, *, seed: int | None = None, device: torch.device | str = "cpu"
) -> Tensor:
    """(m, d) random features: blocks of d orthogonal rows, each row scaled to the norm of a
    Gaussian vector, so every row is marginally N(0, I) (the paper's positive orthogonal RFs).
    Seeded: counter_normal's draws; else torch's global RNG."""
    blocks = -(-m // d)
    count = blocks * d * d + m * d
    if seed is None:
        gauss = torch.randn(count, device=device)
    else:
        gauss = counter_normal(seed, count, device=device)
    square, rest = gauss.split([blocks * d * d, m * d])
    rows = torch.linalg.qr(square.view(blocks, d, d)).Q.transpose(-1, -2).reshape(blocks * d, d)
    return rows[:m] * rest.view(m, d).norm(dim=-1, keepdim=True)


@register_attention("performer", config=PerformerConfig, caps=Capabilities(exact=False))
class PerformerAttention(AttentionCore):
    """FAVOR+ attention with positive orthogonal random features; O(n * nb_features) memory."""

    kernels = SUMS_KERNELS

    features: Tensor

    def __init__(self, cfg: PerformerConfig, *, causal: bool = False) -> None:
        super().__init__(cfg, causal=causal)
        # (m, d) once the head size is known: drawn at the first forward (then in the state dict)
        self.register_buffer("features", torch.empty(0))

    def _features(self, d: int, device: torch.device) -> Tensor:
        """The (m, d) features for head size d: drawn once (seeded), or anew in redraw training."""
        m = self.cfg.nb_features
        if self.cfg.redraw and self.training:
            self.features = orthogonal_features(m, d, device=device)  # evaluation keeps the last
        elif self.features.shape != (m, d):  # drawn where the module lives
            self.features = orthogonal_features(
                m, d, seed=self.cfg.seed, device=self.features.device
            )
        return self.features.to(device)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        saved = state_dict.get(prefix + "features")
        if saved is not None and saved.shape != self.features.shape:  # not drawn here yet
            self.features = torch.empty_like(saved, device=self.features.device)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def sums_for(self, q: Tensor) -> KernelSums:
        """What a call on q computes: FAVOR+ on the features for its head size."""
        d = q.shape[-1]
        wide = compute_dtype(q.dtype)
        return KernelSums(
            FAVOR,
            self.causal,
            self.cfg.chunk_length,
            torch.finfo(wide).tiny,  # only guards 0/0 (every visible key padding)
            proj=self._features(d, q.device),
            scale=d**-0.25,  # q.k / sqrt(d) = (q d^-1/4) . (k d^-1/4)
        )

    def feature_dim(self, head_dim: int) -> int:
        return self.cfg.nb_features

    def attend(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        impl = self.kernel_for(q, key_padding_mask)
        return impl.run(self, q, k, v, key_padding_mask).to(q.dtype)

    # ---- decoding: the running sums S, z over nb_features (constant size) --------------------

    def init_state(self, shape: StateShape) -> SumsState:
        """S and z over the positions seen: nb_features per head."""
        return sums_state(shape, features=self.cfg.nb_features)

    def state_bytes(self, shape: StateShape) -> int:
        return sums_state_bytes(shape, features=self.cfg.nb_features)

    def step(
        self, q: Tensor, k: Tensor, v: Tensor, state: SumsState, key_padding_mask: Tensor | None
    ) -> tuple[Tensor, SumsState]:
        """New tokens against the sums, the forward's features (see attention/decode.py)."""
        d, wide = q.shape[-1], compute_dtype(q.dtype)
        proj = self._features(d, q.device).to(wide)
        feats = CallFeatures(FAVOR, proj, d**-0.25, key_padding_mask, wide)
        if state.length == 0:
            return self.attend(q, k, v, key_padding_mask), sums_add(state, k, v, feats)
        return sums_step(q, k, v, state, feats, eps=torch.finfo(wide).tiny)
