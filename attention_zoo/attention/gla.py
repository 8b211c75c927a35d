"""Gated linear attention with a data-dependent decay: `gate="scalar"`, one decay per head and
token (Mamba2's SSD, Dao & Gu 2024; fla's "simple GLA"), or `gate="vector"`, one per key channel
(GLA, Yang et al. 2024): S_t = diag(a_t) S_{t-1} + k_t v_t^T, o_t = S_t^T q_t / sqrt(d). The log
decays are projected from the hidden states through logsigmoid / 16, as fla's layers do."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torch import Tensor

from ..errors import OptionError
from .inputs import Extra
from .recurrent import RECURRENT, RecurrenceConfig, RecurrentCore, log_decay
from .spec import register_attention

GATES = ("scalar", "vector")


@dataclass(frozen=True, kw_only=True)
class GLAConfig(RecurrenceConfig):
    """Options of gated linear attention."""

    backend: ClassVar[str] = "gla"

    gate: str = "vector"  # vector: a decay per key channel (GLA); scalar: per head (Mamba2's SSD)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.gate not in GATES:
            raise OptionError(f"gla gate {self.gate!r} is not one of: {', '.join(GATES)}")


@register_attention("gla", config=GLAConfig, caps=RECURRENT, variants=({"gate": "scalar"},))
class GLAAttention(RecurrentCore):
    """Linear attention with a data-dependent decay per head or per key channel."""

    @classmethod
    def extras_for(cls, cfg: Any) -> tuple[Extra, ...]:
        return (Extra("log_decay", log_decay, per_key_channel=cfg.gate == "vector"),)

    def gates(self, q: Tensor, extras: dict[str, Tensor]) -> tuple[Tensor | None, Tensor | None]:
        return extras["log_decay"], None
