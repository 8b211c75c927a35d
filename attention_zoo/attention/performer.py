"""Performer attention, FAVOR+ (Choromanski et al. 2021): softmax attention estimated with positive
orthogonal random features, exp(q.k) ~ E[phi(q) . phi(k)], through linear attention's sums.

There is no `dropout` option: no attention probabilities exist to drop. The features are drawn
at the first forward (the head size is known then); a seeded draw builds a torch.Generator, so
under torch.compile(fullgraph=True) run one eager call first or leave `seed` None. Key features
are exp(-|k - w|^2 / 2) <= 1: in float32 they underflow once |k - w|^2 passes ~170 (head sizes
well above 128); use float64 there.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from ..errors import OptionError
from .base import AttentionCore
from .kernels.chunked import check_int
from .kernels.linear_scan import FAVOR, compute_dtype, kernel_attention
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

    def __post_init__(self) -> None:
        check_int("nb_features", self.nb_features, minimum=1, backend="performer")
        check_int("chunk_length", self.chunk_length, minimum=1, backend="performer")
        if self.seed is not None:
            check_int("seed", self.seed, minimum=0, backend="performer")
        if not isinstance(self.redraw, bool):
            raise OptionError(f"performer option redraw must be True or False, got {self.redraw!r}")

    def capabilities(self, caps: Capabilities) -> Capabilities:
        """Redrawn features make two training forwards differ."""
        return dataclasses.replace(caps, deterministic=not self.redraw)


def orthogonal_features(
    m: int, d: int, *, generator: torch.Generator | None = None, device: torch.device | str = "cpu"
) -> Tensor:
    """(m, d) random features: blocks of d orthogonal rows, each row scaled to the norm of a
    Gaussian vector, so every row is marginally N(0, I) (the paper's positive orthogonal RFs)."""
    blocks = -(-m // d)
    gauss = torch.randn(blocks, d, d, generator=generator, device=device)
    rows = torch.linalg.qr(gauss).Q.transpose(-1, -2).reshape(blocks * d, d)[:m]
    norms = torch.randn(m, d, generator=generator, device=device).norm(dim=-1, keepdim=True)
    return rows * norms


@register_attention("performer", config=PerformerConfig, caps=Capabilities(exact=False))
class PerformerAttention(AttentionCore):
    """FAVOR+ attention with positive orthogonal random features; O(n * nb_features) memory."""

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
        elif self.features.shape != (m, d):
            gen = None if self.cfg.seed is None else torch.Generator().manual_seed(self.cfg.seed)
            # drawn on the CPU (where the generator lives), kept where the module lives
            self.features = orthogonal_features(m, d, generator=gen).to(self.features.device)
        return self.features.to(device)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        saved = state_dict.get(prefix + "features")
        if saved is not None and saved.shape != self.features.shape:  # not drawn here yet
            self.features = torch.empty_like(saved, device=self.features.device)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        d = q.shape[-1]
        wide = compute_dtype(q.dtype)
        out = kernel_attention(
            q,
            k,
            v,
            feature_map=FAVOR,
            proj=self._features(d, q.device),
            scale=d**-0.25,  # q.k / sqrt(d) = (q d^-1/4) . (k d^-1/4)
            causal=self.causal,
            chunk=self.cfg.chunk_length,
            eps=torch.finfo(wide).tiny,  # only guards 0/0 (every visible key padding)
            key_padding_mask=key_padding_mask,
        )
        return out.to(q.dtype)
