"""DeltaNet (Schlag et al. 2021; Yang et al. 2024, "Parallelizing Linear Transformers with the
Delta Rule"): the state is corrected towards each new value instead of only accumulating it,
S_t = (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T, with L2-normalised q and k and a step size
b_t projected from the hidden states through a sigmoid; with `negative_eigenvalues` b_t is in
(0, 2) (Grazzi et al. 2025), which lets it track state (parity)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .recurrent import (
    DeltaRuleConfig,
    DeltaRuleCore,
    register_delta_rule,
)


@dataclass(frozen=True, kw_only=True)
class DeltaNetConfig(DeltaRuleConfig):
    """Options of DeltaNet."""

    backend: ClassVar[str] = "deltanet"


@register_delta_rule(DeltaNetConfig)
class DeltaNetAttention(DeltaRuleCore):
    """The delta rule over L2-normalised keys; chunked (closed-form within a chunk) on CPU."""
