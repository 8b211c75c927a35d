"""ReformerConfig: Hugging Face ReformerConfig names, plus the residual variant and backend options.

Defaults follow HF except where a CPU project wants smaller: num_attention_heads 4 (HF 12; head size
hidden/heads = 64 as in HF), attn_layers ("local", "lsh") cycled (HF lists six), and
attention_probs_dropout_prob 0.0 (HF: local 0.05, lsh 0.0), because it needs a backend that applies
dropout to its attention probabilities (one with a `dropout` option); others refuse a value > 0;
axial_norm_std 0.02 (HF 1.0, from trax, where token embeddings are N(0, 1) too; next to HF's
N(0, 0.02) token embeddings a std of 1.0 drowns the tokens: a small model did not learn a copy task
in 400 steps).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

from .attention.spec import get_backend
from .blocks.feedforward import ACTIVATIONS
from .blocks.residual import RESIDUALS
from .errors import ConfigError, OptionError

# Backend options the HF-named fields stand for: backend -> {option: config field}.
HF_BACKEND_OPTIONS: dict[str, dict[str, str]] = {
    "local": {
        "chunk_length": "local_attn_chunk_length",
        "num_chunks_before": "local_num_chunks_before",
        "num_chunks_after": "local_num_chunks_after",
    },
    "lsh": {
        "num_hashes": "num_hashes",
        "num_buckets": "num_buckets",
        "chunk_length": "lsh_attn_chunk_length",
        "num_chunks_before": "lsh_num_chunks_before",
        "num_chunks_after": "lsh_num_chunks_after",
        "seed": "hash_seed",
    },
}
# The backend option that receives attention_probs_dropout_prob, when a backend has it.
ATTENTION_DROPOUT_OPTION = "dropout"

_TUPLE_FIELDS = ("attn_layers", "axial_pos_shape", "axial_pos_embds_dim")


@dataclass(frozen=True, kw_only=True)
class ReformerConfig:
    """Everything that defines a Reformer model; JSON round-trips, so it is stored with results."""

    vocab_size: int = 320
    hidden_size: int = 256
    num_attention_heads: int = 4
    attention_head_size: int | None = None  # None: hidden_size // num_attention_heads
    num_hidden_layers: int = 6
    attn_layers: tuple[str, ...] = ("local", "lsh")  # registry names; layer i uses [i % len]
    feed_forward_size: int = 512
    hidden_act: str = "relu"  # relu, gelu, gelu_new, silu, swish, tanh
    chunk_size_feed_forward: int = 0  # positions per FFN slice; 0 = whole sequence at once
    is_decoder: bool = False  # causal attention in every layer
    hidden_dropout_prob: float = 0.05  # embeddings, sublayer outputs, FFN intermediate
    attention_probs_dropout_prob: float = 0.0  # > 0 only for backends with a `dropout` option
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02  # std of token embeddings and linear weights
    axial_norm_std: float = 0.02  # std of the axial factor tables (HF: 1.0; see module docstring)
    axial_pos_embds: bool = True  # axial factor tables instead of one table per position
    axial_pos_shape: tuple[int, ...] = (64, 64)  # (n1, n2): product = max_position_embeddings
    axial_pos_embds_dim: tuple[int, ...] = (64, 192)  # (d1, d2): sum = hidden_size
    max_position_embeddings: int = 4096  # longest sequence the model accepts
    # lsh options (HF names); passed to the "lsh" backend, overridable through attn_options
    num_hashes: int = 1
    num_buckets: int | tuple[int, ...] | None = None  # None: the backend picks from the length
    lsh_attn_chunk_length: int = 64
    lsh_num_chunks_before: int = 1
    lsh_num_chunks_after: int = 0
    hash_seed: int | None = None  # None: rotations drawn from the global torch RNG
    # local options (HF names); passed to the "local" backend
    local_attn_chunk_length: int = 64
    local_num_chunks_before: int = 1
    local_num_chunks_after: int = 0
    # ours
    residual: str = "reversible"  # standard, reversible or checkpoint
    # backend name -> options, merged over the HF-named ones; works for user-registered backends too
    attn_options: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in _TUPLE_FIELDS:
            value = getattr(self, name)
            if isinstance(value, str):
                value = (value,)
            object.__setattr__(self, name, tuple(value))
        if isinstance(self.num_buckets, list):
            object.__setattr__(self, "num_buckets", tuple(self.num_buckets))
        if not isinstance(self.attn_options, dict):
            raise ConfigError(
                "attn_options must be a dict backend -> {option: value}, "
                f"got {self.attn_options!r}"
            )
        options = {}
        for backend, opts in self.attn_options.items():
            if not isinstance(opts, dict):
                raise ConfigError(
                    f"attn_options[{backend!r}] must be a dict of options, got {opts!r}"
                )
            options[backend] = {k: _freeze(v) for k, v in opts.items()}
        object.__setattr__(self, "attn_options", options)  # a private copy, lists as tuples
        self._validate()

    # ---- derived values -------------------------------------------------------------------

    @property
    def head_size(self) -> int:
        return self.attention_head_size or self.hidden_size // self.num_attention_heads

    def layer_backends(self) -> list[str]:
        """The registry name of every layer's attention."""
        return [self.attn_layers[i % len(self.attn_layers)] for i in range(self.num_hidden_layers)]

    def attention_options(self, backend: str) -> dict[str, Any]:
        """Options for `backend`: HF-named fields, attention dropout, then attn_options on top."""
        options = {
            opt: getattr(self, name) for opt, name in HF_BACKEND_OPTIONS.get(backend, {}).items()
        }
        accepted = get_backend(backend).defaults()
        if ATTENTION_DROPOUT_OPTION in accepted:
            options[ATTENTION_DROPOUT_OPTION] = self.attention_probs_dropout_prob
        options.update(self.attn_options.get(backend, {}))
        return options

    # ---- serialisation ----------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-friendly dict (tuples as lists)."""
        return {f.name: _thaw(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReformerConfig:
        accepted = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(accepted))
        if unknown:
            raise ConfigError(
                f"ReformerConfig has no field(s) {', '.join(map(repr, unknown))}; "
                f"fields: {', '.join(accepted)}"
            )
        return cls(**data)

    def to_json(self, **kwargs: Any) -> str:
        try:
            return json.dumps(self.to_dict(), **kwargs)
        except TypeError as err:
            raise ConfigError(
                f"config is not JSON-serialisable ({err}); use plain values in attn_options"
            ) from None

    @classmethod
    def from_json(cls, text: str) -> ReformerConfig:
        return cls.from_dict(json.loads(text))

    def replace(self, **changes: Any) -> ReformerConfig:
        """A copy with some fields changed, validated again."""
        return dataclasses.replace(self, **changes)

    # ---- validation -------------------------------------------------------------------------

    def _validate(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "num_attention_heads",
            "num_hidden_layers",
            "feed_forward_size",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        if self.attention_head_size is None:
            if self.hidden_size % self.num_attention_heads:
                divisors = [
                    d for d in range(1, min(self.hidden_size, 64) + 1) if self.hidden_size % d == 0
                ]
                raise ConfigError(
                    f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                    f"{self.num_attention_heads}; pick num_attention_heads among {divisors} "
                    f"or set attention_head_size"
                )
        elif self.attention_head_size < 1:
            raise ConfigError(
                f"attention_head_size must be >= 1 or None, got {self.attention_head_size}"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(
                f"unknown hidden_act {self.hidden_act!r}; known: {', '.join(ACTIVATIONS)}"
            )
        if self.chunk_size_feed_forward < 0:
            raise ConfigError(
                "chunk_size_feed_forward must be >= 0 (0 = unchunked), "
                f"got {self.chunk_size_feed_forward}"
            )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        RESIDUALS.get(self.residual)  # UnknownNameError lists standard, reversible, checkpoint
        self._validate_positions()
        self._validate_attention()

    def _validate_positions(self) -> None:
        if not self.axial_pos_embds:
            return
        shape, dims = self.axial_pos_shape, self.axial_pos_embds_dim
        if len(shape) != len(dims) or not shape:
            raise ConfigError(
                f"axial_pos_shape {shape} and axial_pos_embds_dim {dims} must have the same, "
                "non-zero number of factors"
            )
        if any(not isinstance(v, int) or v < 1 for v in shape + dims):
            raise ConfigError(
                f"axial_pos_shape {shape} and axial_pos_embds_dim {dims} must be integers >= 1"
            )
        if sum(dims) != self.hidden_size:
            raise ConfigError(
                f"axial_pos_embds_dim {dims} sums to {sum(dims)}, but must sum to hidden_size "
                f"{self.hidden_size} (the factor embeddings are concatenated)"
            )
        if math.prod(shape) != self.max_position_embeddings:
            raise ConfigError(
                f"axial_pos_shape {shape} has product {math.prod(shape)}, but must equal "
                f"max_position_embeddings {self.max_position_embeddings}; e.g. set "
                f"max_position_embeddings={math.prod(shape)}"
            )

    def _validate_attention(self) -> None:
        if not self.attn_layers:
            raise ConfigError("attn_layers must name at least one attention backend")
        for backend in self.attn_options:
            get_backend(backend)  # unknown name -> UnknownNameError listing the registered ones
        for backend in dict.fromkeys(self.attn_layers):
            spec = get_backend(backend)
            if self.is_decoder and not spec.caps.causal:
                raise ConfigError(f"backend {backend!r} cannot run causally, but is_decoder=True")
            if not self.is_decoder and not spec.caps.non_causal:
                raise ConfigError(f"backend {backend!r} only runs causally; set is_decoder=True")
            if (
                self.attention_probs_dropout_prob > 0
                and ATTENTION_DROPOUT_OPTION not in spec.defaults()
            ):
                with_dropout = _backends_with(ATTENTION_DROPOUT_OPTION)
                raise ConfigError(
                    f"attention_probs_dropout_prob={self.attention_probs_dropout_prob} needs "
                    "backends that apply dropout to attention probabilities (a "
                    f"{ATTENTION_DROPOUT_OPTION!r} option), but {backend!r} has none; set it to 0 "
                    f"and use hidden_dropout_prob, or use: {', '.join(with_dropout) or '(none)'}"
                )
        for backend in dict.fromkeys(self.attn_layers + tuple(self.attn_options)):
            try:
                get_backend(backend).make_config(**self.attention_options(backend))
            except OptionError as err:
                raise OptionError(
                    f"{err} (options come from the HF-named fields and attn_options)"
                ) from None
            except (TypeError, ValueError) as err:
                raise ConfigError(f"options for backend {backend!r} are invalid: {err}") from None


def _backends_with(option: str) -> list[str]:
    from .attention.spec import list_backends

    return [s.name for s in list_backends() if option in s.defaults()]


def _freeze(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    if isinstance(value, dict):
        return {k: _thaw(v) for k, v in value.items()}
    return value
