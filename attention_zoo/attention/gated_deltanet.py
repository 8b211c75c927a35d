"""Gated DeltaNet (Yang et al. 2025, "Gated Delta Networks"): the delta rule with a decay,
S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T; L2-normalised q and k; the log decay
(logsigmoid / 16, as fla's gates) and the step size (a sigmoid; (0, 2) with
`negative_eigenvalues`, Grazzi et al. 2025) projected from the hidden states."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .inputs import Extra
from .recurrent import (
    DeltaRuleConfig,
    DeltaRuleCore,
    log_decay,
    register_delta_rule,
)


@dataclass(frozen=True, kw_only=True)
class GatedDeltaNetConfig(DeltaRuleConfig):
    """Options of Gated DeltaNet."""

    backend: ClassVar[str] = "gated-deltanet"


@register_delta_rule(GatedDeltaNetConfig)
class GatedDeltaNetAttention(DeltaRuleCore):
    """The delta rule with a data-dependent decay per head and token."""

    decay = (Extra("log_decay", log_decay),)
