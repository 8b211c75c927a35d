"""What every recurrent core shares: causal only, a constant-size state S (dk x dv per head) as its
decoding state, and the kernels of kernels/recurrences. A family is one module: its options, its
extra inputs and how they become decays and step sizes (`recurrence_inputs`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch.nn.functional as F
from torch import Tensor

from ..errors import InputError, OptionError
from .base import AttentionCore
from .decode import DecodeState, StateShape
from .inputs import Extra, InputLayout, default_layout, double_sigmoid, unit_sigmoid
from .kernels.recurrences.reference import recurrence
from .kernels.recurrences.table import RECURRENCE_KERNELS, RECURRENCES, RecurrenceInputs
from .kernels.sums.plain import compute_dtype
from .options import check_flag, check_int
from .spec import Capabilities, register_attention

# Causal only (a recurrence reads the past), judged against its own token-by-token form.
RECURRENT = Capabilities(non_causal=False, exact=False, recurrent=True)
GATE_NORMALIZER = 16.0  # log decays = logsigmoid(projection) / 16, as fla's GLA layers


def log_decay(x: Tensor) -> Tensor:
    """A data-dependent log decay in (-inf, 0), mild at initialisation: logsigmoid(x) / 16."""
    return F.logsigmoid(x) / GATE_NORMALIZER


def step_size(negative_eigenvalues: bool) -> Extra:
    """The delta rule's step size: in (0, 1), or (0, 2) with negative eigenvalues."""
    return Extra("beta", double_sigmoid if negative_eigenvalues else unit_sigmoid)


@dataclass(frozen=True, kw_only=True)
class RecurrenceConfig:
    """Options every recurrence has."""

    backend: ClassVar[str]  # the registered name its messages use
    chunk_length: int = 64  # positions per chunk of the chunked form
    expand_v: int = 1  # value width over key width (fla's expand_v)
    kernel: str = "auto"  # auto (the pick rule), chunk, fla (CUDA)

    def __post_init__(self) -> None:
        check_int("chunk_length", self.chunk_length, minimum=1, backend=self.backend)
        if self.chunk_length & (self.chunk_length - 1):  # the per-channel decays halve chunks
            raise OptionError(
                f"{self.backend} option chunk_length must be a power of two (16, 32, 64, ...), "
                f"got {self.chunk_length}"
            )
        check_int("expand_v", self.expand_v, minimum=1, backend=self.backend)
        RECURRENCE_KERNELS.check_option(self.backend, self.kernel)


@dataclass(frozen=True, kw_only=True)
class DeltaRuleConfig(RecurrenceConfig):
    """Options every delta-rule recurrence has."""

    negative_eigenvalues: bool = False  # step sizes in (0, 2) instead of (0, 1)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_flag(self.backend, "negative_eigenvalues", self.negative_eigenvalues)


@dataclass(frozen=True, kw_only=True)
class RecurrentState(DecodeState):
    """The recurrence's state S (b, h, dk, dv) in the compute dtype: constant size."""

    state: Tensor
    uncapturable: ClassVar[str] = ""  # overwritten in place, whatever the position

    def truncated(self, n: int) -> RecurrentState:
        """Padding changed nothing (zero keys and values, decay 1, step size 0): only the count."""
        if not 0 <= n <= self.length:
            raise InputError(f"cannot truncate a state of {self.length} positions to {n}")
        return dataclasses.replace(self, length=n)


class RecurrentCore(AttentionCore):
    """A linear recurrence S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T,
    o_t = S_t^T q_t / sqrt(d)."""

    kernels = RECURRENCE_KERNELS
    extras: ClassVar[tuple[Extra, ...]] = ()
    normalise_qk: ClassVar[bool] = False  # q, k L2-normalised (in the delta rule's kernels)

    @classmethod
    def input_layout(cls, cfg: Any, shared_qk: bool) -> InputLayout:
        layout = default_layout(cfg, shared_qk)
        return dataclasses.replace(layout, expand_v=cfg.expand_v, extras=cls.extras_for(cfg))

    @classmethod
    def extras_for(cls, cfg: Any) -> tuple[Extra, ...]:
        """The extra inputs with these options (a family whose extras depend on them overrides)."""
        return cls.extras

    def gates(self, q: Tensor, extras: dict[str, Tensor]) -> tuple[Tensor | None, Tensor | None]:
        """The log decay and the step size of a call with queries q (None: absent)."""
        raise NotImplementedError

    def recurrence_inputs(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        key_padding_mask: Tensor | None,
        extras: dict[str, Tensor],
    ) -> RecurrenceInputs:
        """The call's inputs; a padded position changes nothing (no key, value, decay or step)."""
        log_decay, beta = self.gates(q, extras)
        if key_padding_mask is not None:
            real = key_padding_mask[:, None, :]  # (b, 1, n)
            k, v = k * real[..., None], v * real[..., None]
            if log_decay is not None:
                log_decay = log_decay * (real if log_decay.dim() == 3 else real[..., None])
            beta = None if beta is None else beta * real
        return RecurrenceInputs(
            q, k, v, log_decay, beta, q.shape[-1] ** -0.5, normalise_qk=self.normalise_qk
        )

    def reference_output(
        self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None, **extras: Tensor
    ) -> Tensor:
        """The same call as `attend` through the token-by-token recurrence (kernels/recurrences/
        reference.py): what every implementation is judged against. O(n) Python steps: tests."""
        x = self.recurrence_inputs(q, k, v, key_padding_mask, extras)
        gates = {"log_decay": x.log_decay, "beta": x.beta, "normalise_qk": x.normalise_qk}
        out, _ = recurrence(x.q, x.k, x.v, scale=x.scale, **gates)
        return out.to(q.dtype)

    # ---- decoding: the state S ----------------------------------------------------------------

    def init_state(self, shape: StateShape) -> RecurrentState:
        s, wide = shape, compute_dtype(shape.dtype)
        return RecurrentState(
            shape=s, state=s.tensor(s.batch, s.heads, s.head_dim, s.dv, dtype=wide)
        )

    def state_bytes(self, shape: StateShape) -> int:
        s = shape
        return s.batch * s.heads * s.head_dim * s.dv * s.itemsize(compute_dtype(s.dtype))

    def step(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        state: RecurrentState,
        key_padding_mask: Tensor | None,
        **extras: Tensor,
    ) -> tuple[Tensor, RecurrentState]:
        """t new tokens from the state (the prefill: from zeros), by the implementation the pick
        rule chooses; S is overwritten in place."""
        recurrence = RECURRENCES[self.kernel_for(q, key_padding_mask).name]
        x = self.recurrence_inputs(q, k, v, key_padding_mask, extras)
        out, after = recurrence(x, self.cfg.chunk_length, state.state)
        state.state.copy_(after)
        return out.to(q.dtype), dataclasses.replace(state, length=state.length + q.shape[2])


class DeltaRuleCore(RecurrentCore):
    """The delta rule over L2-normalised q and k with a step size per head and token, and where
    the family declares one (`decay`) a log decay per head and token."""

    decay: ClassVar[tuple[Extra, ...]] = ()  # the log decay's input, if the family has one
    normalise_qk = True

    @classmethod
    def extras_for(cls, cfg: Any) -> tuple[Extra, ...]:
        return (*cls.decay, step_size(cfg.negative_eigenvalues))

    def gates(self, q: Tensor, extras: dict[str, Tensor]) -> tuple[Tensor | None, Tensor | None]:
        return extras.get("log_decay"), extras["beta"]


def register_delta_rule(
    config: type[DeltaRuleConfig],
) -> Callable[[type[DeltaRuleCore]], type[DeltaRuleCore]]:
    """Class decorator: register a delta-rule core under its options' name, with the family's
    capabilities and its negative-eigenvalues variant (declared once for every delta rule)."""
    return register_attention(
        config.backend, config=config, caps=RECURRENT, variants=({"negative_eigenvalues": True},)
    )


__all__ = ["RECURRENT", "RecurrenceConfig", "RecurrentCore", "RecurrentState", "log_decay"]
