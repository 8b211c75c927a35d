"""ReformerConfig: Hugging Face ReformerConfig names, plus the residual variant and backend options.

Defaults follow HF except where a CPU project wants smaller: num_attention_heads 4 (HF 12; head size
hidden/heads = 64 as in HF); attention-probability dropout 0.0 (HF: local 0.05, lsh 0.0);
axial_norm_std 0.02 (HF 1.0, from trax, where token embeddings are N(0, 1) too; next to HF's
N(0, 0.02) token embeddings a std of 1.0 drowns the tokens: a small model did not learn a copy task
in 400 steps). `ReformerConfig.from_hf` takes an HF config as it is.
"""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

from .attention.spec import backends_where, causal_error, get_backend
from .blocks.feedforward import ACTIVATIONS
from .blocks.residual import RESIDUALS
from .declarative import check_keys, field_names
from .errors import ConfigError, OptionError
from .hf_reformer import (
    HF_ATTENTION,
    HF_BACKEND_OPTIONS,
    SAME_FIELDS,
    HFConversionWarning,
    read_hf_config,
    translate_config,
)

# The backend option that receives the attention-probability dropout, when a backend has it.
ATTENTION_DROPOUT_OPTION = "dropout"
# HF's per-backend attention dropout fields; other backends take attention_probs_dropout_prob.
HF_DROPOUT_FIELDS = {
    "local": "local_attention_probs_dropout_prob",
    "lsh": "lsh_attention_probs_dropout_prob",
}

_TUPLE_FIELDS = ("attn_layers", "axial_pos_shape", "axial_pos_embds_dim")


@dataclass(frozen=True, kw_only=True)
class ReformerConfig:
    """Everything that defines a Reformer model; JSON round-trips, so it is stored with results."""

    vocab_size: int = 320
    hidden_size: int = 256
    num_attention_heads: int = 4
    attention_head_size: int | None = None  # None: hidden_size // num_attention_heads
    # registry names, one per layer as in HF; layer i uses [i % len] when num_hidden_layers is more
    attn_layers: tuple[str, ...] = ("local", "lsh", "local", "lsh", "local", "lsh")
    num_hidden_layers: int | None = None  # None: len(attn_layers), as HF
    feed_forward_size: int = 512
    hidden_act: str = "relu"  # HF's activation names (blocks/feedforward.py ACTIVATIONS)
    chunk_size_feed_forward: int = 0  # positions per FFN slice; 0 = whole sequence at once
    chunk_size_lm_head: int = 0  # positions per LM-head slice; 0 = whole sequence at once
    is_decoder: bool = False  # causal attention in every layer
    hidden_dropout_prob: float = 0.05  # embeddings, sublayer outputs, FFN intermediate, top
    # attention-probability dropout of backends with a `dropout` option
    attention_probs_dropout_prob: float = 0.0
    local_attention_probs_dropout_prob: float | None = None  # None: attention_probs_dropout_prob
    lsh_attention_probs_dropout_prob: float | None = None  # None: attention_probs_dropout_prob
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02  # std of token embeddings and linear weights
    axial_norm_std: float = 0.02  # std of the axial factor tables (HF: 1.0; see module docstring)
    # False: no position embedding, order only from causal attention (what a recurrence needs to
    # run past its training length: no position it never trained on)
    position_embeddings: bool = True
    # True: each token's embedding plus a learned embedding of the token before it (a causal
    # convolution of width 2 over tokens, as recurrent LM layers' short convolutions): every
    # mechanism reads the previous token without first learning a previous-token head
    previous_token_embeddings: bool = False
    axial_pos_embds: bool = True  # axial factor tables instead of one table per position
    axial_pos_shape: tuple[int, ...] = (64, 64)  # (n1, n2): product >= the longest sequence
    axial_pos_embds_dim: tuple[int, ...] = (64, 192)  # (d1, d2): sum = hidden_size
    max_position_embeddings: int = 4096  # longest sequence the model accepts
    # token HF's chunk padding appends (masked: it changes no real output); None: token 0
    pad_token_id: int | None = 0
    # lsh options (HF names); passed to the "lsh" backend, overridable through attn_options
    num_hashes: int = 1
    # int or factors (a, b, ...) -> a*b*... buckets; None: HF's rule at max_position_embeddings
    num_buckets: int | tuple[int, ...] | None = None
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
    # HF fields that change nothing computed here (tokenizer, generation, bookkeeping), for to_hf
    hf_extra: dict[str, Any] = field(default_factory=dict)

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
        object.__setattr__(self, "hf_extra", dict(self.hf_extra))
        if self.num_hidden_layers is None:
            object.__setattr__(self, "num_hidden_layers", len(self.attn_layers))
        self._validate()

    @classmethod
    def from_hf(cls, source: Any) -> ReformerConfig:
        """The config of a Hugging Face Reformer: a transformers ReformerConfig, its dict, or a path
        to config.json (or its folder). local/lsh layers get HF's semantics; fields that change
        nothing computed here go to hf_extra, named in a warning; what HF cannot run is refused."""
        return cls(**translate_config(read_hf_config(source)))

    def hf_fields(self) -> dict[str, Any]:
        """HF config fields of this config: what its layers really run, under HF's names."""
        backends = self.layer_backends()
        others = sorted(set(backends) - set(HF_ATTENTION))
        if others:
            raise ConfigError(
                "HF's Reformer has only 'local' and 'lsh' attention; layers use "
                + ", ".join(others)
            )
        if not self.position_embeddings:
            raise ConfigError(
                "HF's Reformer always adds position embeddings; this model has none "
                "(position_embeddings=False)"
            )
        if self.previous_token_embeddings:
            raise ConfigError(
                "HF's Reformer embeds each token alone; this model adds the previous token's "
                "embedding (previous_token_embeddings=True)"
            )
        if self.residual != "reversible":
            raise ConfigError(
                f"HF's Reformer is reversible; this model uses residual={self.residual!r}: "
                "config.replace(residual='reversible') keeps the weights"
            )
        for backend in sorted(set(backends)):
            kv = self.attention_options(backend).get("kv_heads")
            if kv not in (None, self.num_attention_heads):
                raise ConfigError(
                    f"HF's Reformer projects keys and values for every head; the {backend!r} "
                    f"layers share them over kv_heads={kv} (drop kv_heads to convert)"
                )
        if self.axial_pos_embds and len(self.axial_pos_shape) != 2:
            raise ConfigError(
                "HF's Reformer factors axial positions in two; this model has "
                f"axial_pos_shape={tuple(self.axial_pos_shape)}"
            )
        data = dict(self.hf_extra)
        data.update({name: _thaw(getattr(self, name)) for name in SAME_FIELDS})
        data["attn_layers"] = backends
        data["num_hidden_layers"] = len(backends)
        data["attention_head_size"] = self.head_size
        for backend in HF_ATTENTION:  # the options the cores get, attn_options included
            options = self.attention_options(backend)
            for option, name in HF_BACKEND_OPTIONS[backend].items():
                data[name] = _thaw(options[option])
            data[f"{backend}_attention_probs_dropout_prob"] = options.get("dropout", 0.0)
            if backend in backends and options.get("semantics") != "hf":
                warnings.warn(
                    f"{backend!r} layers run exact semantics here; transformers runs its own, so "
                    "the HF model computes something else on the same weights",
                    HFConversionWarning,
                    stacklevel=3,
                )
        data.pop("model_type", None)
        return data

    # ---- derived values -------------------------------------------------------------------

    @property
    def max_positions(self) -> int:
        """The most positions a sequence may have: max_position_embeddings, and the axial grid's
        size where axial position embeddings are used (HF checkpoints may have it smaller)."""
        if self.position_embeddings and self.axial_pos_embds:
            return min(self.max_position_embeddings, math.prod(self.axial_pos_shape))
        return self.max_position_embeddings

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
            options[ATTENTION_DROPOUT_OPTION] = self.attention_dropout(backend)
        options.update(self.attn_options.get(backend, {}))
        if backend == "lsh" and options["num_buckets"] is None:  # sized for the chunk used
            options["num_buckets"] = hf_num_buckets(
                self.max_position_embeddings, options["chunk_length"]
            )
        return options

    def attention_dropout(self, backend: str) -> float:
        """Attention-probability dropout of `backend`: its HF field, else the shared one."""
        specific = getattr(self, HF_DROPOUT_FIELDS.get(backend, ""), None)
        return self.attention_probs_dropout_prob if specific is None else specific

    # ---- serialisation ----------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-friendly dict (tuples as lists)."""
        return {f.name: _thaw(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReformerConfig:
        check_keys(data, field_names(cls), where="ReformerConfig", noun="field")
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
        if len(self.attn_layers) > self.num_hidden_layers:
            raise ConfigError(
                f"attn_layers lists {len(self.attn_layers)} layers, but num_hidden_layers="
                f"{self.num_hidden_layers}; leave num_hidden_layers unset (it follows attn_layers, "
                f"as in HF) or list at most {self.num_hidden_layers} layers"
            )
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
        for name in ("chunk_size_feed_forward", "chunk_size_lm_head"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{name} must be an integer >= 0 (0 = unchunked), got {value!r}")
        pad = self.pad_token_id
        if pad is not None and not (isinstance(pad, int) and 0 <= pad < self.vocab_size):
            raise ConfigError(
                f"pad_token_id must be a token id (0..{self.vocab_size - 1}) or None, got {pad!r}"
            )
        for name in (
            "hidden_dropout_prob",
            "attention_probs_dropout_prob",
            *HF_DROPOUT_FIELDS.values(),
        ):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {value}")
        RESIDUALS.get(self.residual)  # UnknownNameError lists standard, reversible, checkpoint
        self._validate_positions()
        self._validate_attention()

    def _validate_positions(self) -> None:
        for name in ("position_embeddings", "previous_token_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if not (self.position_embeddings and self.axial_pos_embds):
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

    def _validate_attention(self) -> None:
        if not self.attn_layers:
            raise ConfigError("attn_layers must name at least one attention backend")
        for backend in self.attn_options:
            get_backend(backend)  # unknown name -> UnknownNameError listing the registered ones
        for backend in dict.fromkeys(self.attn_layers):
            spec = get_backend(backend)
            if self.is_decoder and not spec.caps.causal:
                fix = "set is_decoder=False (is_decoder=True asks for causal attention)"
                raise ConfigError(causal_error(backend, fix=fix))
            if not self.is_decoder and not spec.caps.non_causal:
                raise ConfigError(f"backend {backend!r} only runs causally; set is_decoder=True")
            dropout = self.attention_dropout(backend)
            if dropout > 0 and ATTENTION_DROPOUT_OPTION not in spec.defaults():
                with_dropout = backends_where(lambda s: ATTENTION_DROPOUT_OPTION in s.defaults())
                raise ConfigError(
                    f"attention-probability dropout {dropout} needs a backend with a "
                    f"{ATTENTION_DROPOUT_OPTION!r} option, but {backend!r} has none; set it to 0 "
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
        unused = [b for b in self.attn_options if b not in self.attn_layers]
        if unused:
            raise ConfigError(
                f"attn_options has options for {', '.join(map(repr, unused))}, but no layer uses "
                f"it (attn_layers: {', '.join(self.attn_layers)}); add it to attn_layers or drop "
                "its options"
            )
        self._validate_option_fields()

    def _validate_option_fields(self) -> None:
        """An HF-named field set away from its default and the same option in attn_options must
        agree: otherwise one of the two would be silently ignored."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for backend, options in self.attn_options.items():
            for option, name in HF_BACKEND_OPTIONS.get(backend, {}).items():
                value = getattr(self, name)
                if option in options and value != defaults[name] and options[option] != value:
                    raise ConfigError(
                        f"{name}={value!r} and attn_options[{backend!r}][{option!r}]="
                        f"{options[option]!r} disagree; set only one of them"
                    )


def hf_num_buckets(max_positions: int, chunk_length: int) -> int | tuple[int, int]:
    """HF's num_buckets=None rule, taken once at max_position_embeddings (so no batch's padding can
    change it): ~2 * n / chunk as a power of two, split into two powers of two above
    2 * max(sqrt(n / chunk), chunk)."""
    chunks = max(max_positions // chunk_length, 1)
    power = (2 * chunks).bit_length() - 1
    if 2**power > 2 * max(int(chunks**0.5), chunk_length):
        return (2 ** (power // 2), 2 ** (power - power // 2))
    return 2**power


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
