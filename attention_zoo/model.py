"""The Reformer skeleton (Kitaev et al. 2020) as Hugging Face builds it: embeddings, a residual
stack of (attention, FFN) layers, a LayerNorm over the two concatenated streams, a causal LM head
or a pooled sequence-classification head.
Which attention fills each layer, the residual variant, FFN chunking and the position embeddings are
independent fields of ReformerConfig; `from_hf`/`to_hf` move weights from and to transformers
(hf_reformer.py converts them).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch._subclasses.fake_tensor import is_fake

from . import generation
from . import hf_reformer as hf
from .attention.spec import BACKENDS, BackendSpec, get_backend
from .blocks.attention import SelfAttention
from .blocks.feedforward import ChunkedFeedForward, chunked
from .blocks.layer import PreNorm, ReformerLayer
from .blocks.position import (
    AxialPositionEmbedding,
    NoPositionEmbedding,
    TablePositionEmbedding,
    check_length,
)
from .blocks.residual import RESIDUALS, StandardResidual
from .config import ReformerConfig
from .errors import ConfigError, InputError, OptionError, ShapeError, ZooError
from .hf_reformer import HF_BACKEND_OPTIONS

log = logging.getLogger(__name__)

IGNORE_INDEX = -100  # labels with this value add nothing to the loss (as in HF)


@dataclass
class ReformerOutput:
    """ReformerModel output: both residual streams, concatenated and normalised: (b, n, 2 * hidden).

    As HF's ReformerModel; a single-stream residual (standard, checkpoint) gives its stream twice.
    """

    last_hidden_state: Tensor


@dataclass
class ReformerLMOutput:
    """ReformerLM output.

    logits: (b, n, vocab); loss: mean next-token cross-entropy over labels != -100 (None without
    labels); hidden_states: the (b, n, 2 * hidden) states the LM head reads.
    """

    logits: Tensor
    loss: Tensor | None = None
    hidden_states: Tensor | None = None


@dataclass
class SequenceClassifierOutput:
    """ReformerForSequenceClassification output.

    logits: (b, num_labels); loss: mean cross-entropy against labels (b,) (None without labels).
    """

    logits: Tensor
    loss: Tensor | None = None


def build_layer(
    config: ReformerConfig, index: int, device: str | torch.device | None = None
) -> ReformerLayer:
    """Layer `index`: f = PreNorm(SelfAttention(attn_layers[index % len])), g = PreNorm(FFN)."""
    backend = config.layer_backends()[index]
    attention = SelfAttention(
        config.hidden_size,
        config.num_attention_heads,
        backend,
        head_size=config.head_size,
        causal=config.is_decoder,
        device=device,
        **config.attention_options(backend),
    )
    ffn = ChunkedFeedForward(
        config.hidden_size,
        config.feed_forward_size,
        activation=config.hidden_act,
        dropout=config.hidden_dropout_prob,
        chunk_size=config.chunk_size_feed_forward,
    )
    norm = {"eps": config.layer_norm_eps, "dropout": config.hidden_dropout_prob}
    return ReformerLayer(
        PreNorm(config.hidden_size, attention, **norm), PreNorm(config.hidden_size, ffn, **norm)
    )


class ReformerModel(nn.Module):
    """Token + position embeddings -> residual stack -> LayerNorm: (b, n) ids -> (b, n, hidden)."""

    def __init__(self, config: ReformerConfig, *, device: str | torch.device | None = None) -> None:
        """device: where the attention cores will run (availability check); default CUDA if any."""
        super().__init__()
        self.config = config
        self._device = device
        self.tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        dropout = config.hidden_dropout_prob
        if not config.position_embeddings:
            self.positions: nn.Module = NoPositionEmbedding(config.hidden_size)
        elif config.axial_pos_embds:
            self.positions = AxialPositionEmbedding(
                config.axial_pos_shape,
                config.axial_pos_embds_dim,
                init_std=config.axial_norm_std,
                dropout=dropout,
            )
        else:
            self.positions = TablePositionEmbedding(
                config.max_position_embeddings,
                config.hidden_size,
                init_std=config.initializer_range,
                dropout=dropout,
            )
        self.previous_tokens = (
            nn.Embedding(config.vocab_size, config.hidden_size)
            if config.previous_token_embeddings
            else None
        )
        self.dropout = nn.Dropout(dropout)  # on token embeddings; positions drop their own (HF)
        layers = [build_layer(config, i, device) for i in range(config.num_hidden_layers)]
        self.encoder: StandardResidual = RESIDUALS.get(config.residual)(layers)
        # HF: LayerNorm over the concatenated streams, then dropout
        self.norm = nn.LayerNorm(2 * config.hidden_size, eps=config.layer_norm_eps)
        self.out_dropout = nn.Dropout(dropout)
        _init_weights(self, config.initializer_range)

    @property
    def layers(self) -> nn.ModuleList:
        return self.encoder.layers

    @classmethod
    def from_hf(
        cls, source: Any, *, config: Any = None, device: str | torch.device | None = None
    ) -> ReformerModel:
        """The model of a transformers ReformerModel (of an HF model with a head: its encoder).

        Sources as ReformerLM.from_hf, without the LM head's weights.
        """
        if isinstance(source, nn.Module) and hasattr(source, "reformer"):
            source = source.reformer
        return _from_hf(cls, source, config, device, prefix="reformer.")

    def to_hf(self) -> Any:
        """This model as a transformers ReformerModel (weights copied bit for bit)."""
        from transformers import ReformerModel as HFReformerModel

        return hf.to_hf(self, HFReformerModel, prefix="reformer.")

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> ReformerOutput:
        """input_ids (b, n) long; attention_mask (b, n) bool or 0/1, 1 = real token (optional)."""
        if input_ids.dim() != 2:
            raise ShapeError(
                f"input_ids must be (batch, length), got shape {tuple(input_ids.shape)}"
            )
        _check_token_ids(input_ids, self.config.vocab_size)
        b, n = input_ids.shape
        mask = _padding_mask(attention_mask, input_ids.shape)
        if pad := hf_padding(self.config, n):  # as HF: whole chunks, padding masked
            pad_id = self.config.pad_token_id
            input_ids = F.pad(input_ids, (0, pad), value=0 if pad_id is None else pad_id)
            mask = F.pad(
                input_ids.new_ones(b, n, dtype=torch.bool) if mask is None else mask,
                (0, pad),
                value=False,
            )
        length = n + pad
        check_length(length, self.config.max_position_embeddings)
        x = self.embed(input_ids, mask)  # (b, length, hidden)
        x = self.out_dropout(self.norm(self.encoder(x, mask)))  # (b, length, 2 * hidden)
        return ReformerOutput(x[:, :n])

    def embed(
        self,
        ids: Tensor,
        mask: Tensor | None = None,
        *,
        start: int = 0,
        before: tuple[Tensor, Tensor | None] | None = None,
    ) -> Tensor:
        """Embeddings (b, t, hidden) of ids (b, t) at positions start..: the token's, the previous
        token's where the config adds it, and the position's. before: the tokens (b,) preceding
        ids[:, 0] and whether each is real (None: all); None: none. A padding position (mask
        False) is no previous token."""
        b, t = ids.shape
        x = self.tokens(ids)
        if self.previous_tokens is not None:
            real = ids.new_ones(b, t, dtype=torch.bool) if mask is None else mask
            if before is None:  # nothing before the sequence's start
                first, first_real = ids[:, :1], real.new_zeros(b, 1)
            else:
                first = before[0][:, None]
                first_real = real.new_ones(b, 1) if before[1] is None else before[1][:, None]
            previous = torch.cat([first, ids[:, :-1]], dim=1)
            previous_real = torch.cat([first_real, real[:, :-1]], dim=1)
            x = x + self.previous_tokens(previous) * previous_real[..., None]
        return self.dropout(x) + self.positions(t, b, start=start)

    # ---- evaluation-time attention changes (weights kept) -------------------------------------

    def set_attention_options(self, backend: str, **options: Any) -> ReformerConfig:
        """Change `backend`'s options in every layer using it (e.g. num_hashes=8 for evaluation).

        Cores are rebuilt, projection weights kept; `self.config` is updated to say so. Returns it.
        """
        merged = {**self.config.attn_options.get(backend, {}), **options}
        # an option with an HF-named field (num_hashes, ...) sets the field too, so they agree
        fields = {
            field: options[option]
            for option, field in HF_BACKEND_OPTIONS.get(backend, {}).items()
            if option in options
        }
        config = self.config.replace(
            attn_options={**self.config.attn_options, backend: merged}, **fields
        )
        self._rebuild_cores(
            config, [i for i, b in enumerate(config.layer_backends()) if b == backend]
        )
        return config

    def replace_attention(self, layers: str | int | Iterable[int], backend: str) -> ReformerConfig:
        """Swap the attention core of some layers for `backend`, keeping the projection weights.

        layers: a backend name (every layer using it), a layer index or indices. The new backend
        must use the same projection layout (shared QK or not): e.g. "lsh" -> "shared-qk" to
        evaluate an LSH-trained layer with full attention. Its options come from the config (HF
        fields + attn_options). `self.config` is updated (attn_layers listed per layer if needed).
        """
        per_layer = self.config.layer_backends()
        if isinstance(layers, str):
            chosen = [i for i, b in enumerate(per_layer) if b == layers]
            if not chosen:
                raise ConfigError(f"no layer uses backend {layers!r}; layers use: {per_layer}")
        else:
            chosen = [layers] if isinstance(layers, int) else list(layers)
            bad = [i for i in chosen if not 0 <= i < len(per_layer)]
            if bad:
                raise ConfigError(f"layer indices {bad} out of range 0..{len(per_layer) - 1}")
        for i in chosen:
            per_layer[i] = backend
        attn_layers = _shortest_cycle(per_layer)
        kept = {b: o for b, o in self.config.attn_options.items() if b in attn_layers}
        config = self.config.replace(attn_layers=attn_layers, attn_options=kept)
        self._rebuild_cores(config, chosen)
        return config

    def _rebuild_cores(self, config: ReformerConfig, indices: list[int]) -> None:
        """Layers `indices` as `config` says, keeping their projection weights (and a core's own
        parameters where its backend stays): refused, changing nothing, where the new input
        layout needs other projections (shared QK or not, shared KV heads, extra inputs)."""
        backends = config.layer_backends()
        layouts = {}
        for i in indices:
            attention, name = self.layers[i].attention, backends[i]
            layouts[i] = layout = attention.layout_of(name, config.attention_options(name))
            h, d = attention.num_heads, attention.head_size
            if layout.projections(h, d) != attention.sizes:
                same = [s.name for s in BACKENDS if _projections(s, h, d) == attention.sizes]
                raise OptionError(
                    f"layer {i} uses {attention.spec.name!r} with projections "
                    f"{_describe(attention.sizes)}; {name!r} with these options needs "
                    f"{_describe(layout.projections(h, d))}, so the weights cannot be kept. "
                    f"Backends with the same projections: {', '.join(same)}"
                )
        for i in indices:
            attention, name = self.layers[i].attention, backends[i]
            core = attention.make_core(
                name,
                causal=config.is_decoder,
                device=self._device,
                **config.attention_options(name),
            )
            core = core.to(device=next(attention.parameters()).device)
            if attention.spec.name == name:  # the same mechanism: its learned parameters stay
                kept = core.state_dict()
                kept.update(
                    (k, v)
                    for k, v in attention.core.state_dict().items()
                    if k in kept and kept[k].shape == v.shape
                )
                core.load_state_dict(kept)
            attention.core, attention.layout = core, layouts[i]
            attention.spec = get_backend(name)
        self.config = config
        log.info("attention now: %s", config.layer_backends())


class EncoderWithHead(nn.Module):
    """A ReformerModel (`reformer`) with a head: its config and attention are the encoder's."""

    reformer: ReformerModel

    @property
    def config(self) -> ReformerConfig:
        return self.reformer.config

    def set_attention_options(self, backend: str, **options: Any) -> ReformerConfig:
        return self.reformer.set_attention_options(backend, **options)

    def replace_attention(self, layers: str | int | Iterable[int], backend: str) -> ReformerConfig:
        return self.reformer.replace_attention(layers, backend)

    set_attention_options.__doc__ = ReformerModel.set_attention_options.__doc__
    replace_attention.__doc__ = ReformerModel.replace_attention.__doc__


class ReformerLM(EncoderWithHead):
    """Causal language model: ReformerModel + linear head; loss on next tokens like HF's."""

    def __init__(self, config: ReformerConfig, *, device: str | torch.device | None = None) -> None:
        super().__init__()
        if not config.is_decoder:
            raise ConfigError(
                "ReformerLM predicts the next token, so it needs causal attention: "
                "set is_decoder=True "
                "(use ReformerModel for a bidirectional encoder)"
            )
        self.reformer = ReformerModel(config, device=device)
        self.lm_head = nn.Linear(2 * config.hidden_size, config.vocab_size)  # reads both streams
        _init_weights(self.lm_head, config.initializer_range)

    def forward(
        self, input_ids: Tensor, labels: Tensor | None = None, attention_mask: Tensor | None = None
    ) -> ReformerLMOutput:
        """input_ids (b, n); labels (b, n), shifted inside (position i predicts labels[i + 1]),
        -100 = ignored, usually labels = input_ids; attention_mask (b, n) bool or 0/1."""
        hidden = self.reformer(input_ids, attention_mask).last_hidden_state
        logits = chunked(self.lm_head, hidden, self.config.chunk_size_lm_head)  # (b, n, vocab)
        loss = None
        if labels is not None:
            if labels.shape != input_ids.shape:
                raise ShapeError(
                    f"labels must have input_ids' shape {tuple(input_ids.shape)}, "
                    f"got {tuple(labels.shape)}"
                )
            loss = F.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]),
                labels[:, 1:].reshape(-1),
                ignore_index=IGNORE_INDEX,
            )
        return ReformerLMOutput(logits=logits, loss=loss, hidden_states=hidden)

    @classmethod
    def from_hf(
        cls,
        source: Any,
        *,
        config: Any = None,
        device: str | torch.device | None = None,
    ) -> ReformerLM:
        """The model of a transformers ReformerModelWithLMHead: same weights, same computation.

        source: the HF model, its state dict (then `config`: its config, dict or config.json), or
        a local folder with config.json and model.safetensors or pytorch_model.bin. Layers run
        HF's semantics; tokenizer/generation-only config fields are kept for to_hf() (a warning
        names them). device: where the cores will run (default: where the weights are).
        """
        return _from_hf(cls, source, config, device, prefix="")

    def to_hf(self) -> Any:
        """This model as a transformers ReformerModelWithLMHead (weights copied bit for bit)."""
        from transformers import ReformerModelWithLMHead

        return hf.to_hf(self, ReformerModelWithLMHead, prefix="")

    def generate(
        self,
        input_ids: Tensor,
        max_new_tokens: int,
        *,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int | None = 50,
        top_p: float = 1.0,
        seed: int | None = None,
        use_cache: bool = True,
        attention_mask: Tensor | None = None,
        eos_token_id: int | list[int] | Literal["config"] | None = "config",
        pad_token_id: int | None = None,
    ) -> Tensor:
        """input_ids (b, n) and up to max_new_tokens generated tokens each: (b, n + new).

        Greedy, or sampled (do_sample) after HF's temperature, top_k and top_p warpers, the
        draws seeded by `seed` (else torch's global RNG): token for token what transformers'
        generate gives. use_cache: every layer keeps its attention's decoding state (KV cache,
        window, running sums, LSH buckets; see attention/decode.py) and each new token runs
        one step; else each token runs the forward over the whole sequence. A sequence that
        produced eos_token_id (or one of a list) goes on with pad_token_id (default: the config's,
        else the first eos, as transformers does); eos_token_id defaults to the config's own, as
        transformers reads it (an HF checkpoint's; a model built here has none); None: never stop
        early."""
        if eos_token_id == "config":
            eos_token_id = self.config.hf_extra.get("eos_token_id")
        sampling = generation.Sampling(
            do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed
        )
        if input_ids.dim() == 2:
            _check_token_ids(input_ids, self.config.vocab_size)
            check_generation_length(self.config, input_ids.shape[1], max_new_tokens, use_cache)
        return generation.generate(
            self,
            input_ids,
            max_new_tokens,
            sampling,
            use_cache=use_cache,
            attention_mask=_padding_mask(attention_mask, input_ids.shape),
            prompt_padding=hf_padding(self.config, input_ids.shape[-1]),
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
        )


class ReformerClassificationHead(nn.Module):
    """HF's head: the first token's state (b, 2 * hidden) -> dropout, dense, tanh, dropout, out."""

    def __init__(self, config: ReformerConfig, num_labels: int, dropout: float | None) -> None:
        super().__init__()
        self.dense = nn.Linear(2 * config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob if dropout is None else dropout)
        self.out_proj = nn.Linear(config.hidden_size, num_labels)

    def forward(self, hidden_states: Tensor) -> Tensor:
        """(b, n, 2 * hidden) -> (b, num_labels), read at position 0 (a [CLS] token)."""
        x = self.dropout(hidden_states[:, 0])
        x = self.dropout(torch.tanh(self.dense(x)))
        return self.out_proj(x)


class ReformerForSequenceClassification(EncoderWithHead):
    """Sequence classifier as transformers': ReformerModel + a head on the first token's state.

    A bidirectional encoder (is_decoder=False); num_labels and classifier_dropout are HF's
    config fields of the same names (None: hidden_dropout_prob).
    """

    def __init__(
        self,
        config: ReformerConfig,
        *,
        num_labels: int = 2,
        classifier_dropout: float | None = None,
        device: str | torch.device | None = None,
    ) -> None:
        super().__init__()
        if config.is_decoder:
            raise ConfigError(
                "sequence classification reads the whole sequence: set is_decoder=False "
                "(causal attention would hide every later token from the pooled first one)"
            )
        if num_labels < 2:
            raise ConfigError(f"num_labels must be >= 2 (classes), got {num_labels}")
        self.num_labels, self.classifier_dropout = num_labels, classifier_dropout
        self.reformer = ReformerModel(config, device=device)
        self.classifier = ReformerClassificationHead(config, num_labels, classifier_dropout)
        _init_weights(self.classifier, config.initializer_range)

    def forward(
        self, input_ids: Tensor, labels: Tensor | None = None, attention_mask: Tensor | None = None
    ) -> SequenceClassifierOutput:
        """input_ids (b, n) with the token to pool first; labels (b,) class ids (optional)."""
        hidden = self.reformer(input_ids, attention_mask).last_hidden_state
        logits = self.classifier(hidden)  # (b, num_labels)
        loss = None
        if labels is not None:
            if labels.shape != input_ids.shape[:1]:
                raise ShapeError(
                    f"labels must be one class id per sequence, shape ({input_ids.shape[0]},), "
                    f"got {tuple(labels.shape)}"
                )
            loss = F.cross_entropy(logits, labels)
        return SequenceClassifierOutput(logits=logits, loss=loss)

    @classmethod
    def from_hf(
        cls, source: Any, *, config: Any = None, device: str | torch.device | None = None
    ) -> ReformerForSequenceClassification:
        """The model of a transformers ReformerForSequenceClassification (sources as
        ReformerLM.from_hf); num_labels is read from the head's weights."""
        fields = hf.classifier_fields(source, config)
        return _from_hf(cls, source, config, device, prefix="", **fields)

    def to_hf(self) -> Any:
        """This model as a transformers ReformerForSequenceClassification (weights copied)."""
        from transformers import ReformerForSequenceClassification as HFClassifier

        return hf.to_hf(
            self,
            HFClassifier,
            prefix="",
            num_labels=self.num_labels,
            classifier_dropout=self.classifier_dropout,
        )


def hf_padding(config: ReformerConfig, n: int) -> int:
    """Positions HF appends to a length-n batch: up to a multiple of the lcm of the chunk lengths,
    when n exceeds the smallest chunk. Only layers with HF semantics ask for it."""
    chunks = [
        options["chunk_length"]
        for options in map(config.attention_options, dict.fromkeys(config.layer_backends()))
        if options.get("semantics") == "hf"
    ]
    if not chunks or n <= min(chunks) or n % (multiple := math.lcm(*chunks)) == 0:
        return 0
    return multiple - n % multiple


def _from_hf(
    cls: type, source: Any, config: Any, device: Any, prefix: str, **model_kwargs: Any
) -> Any:
    """Build `cls` (ReformerLM, or ReformerModel with prefix "reformer.") from an HF source;
    `model_kwargs` go to its constructor."""
    hf_config, state, training = hf.read_source(source, config)
    our_config = ReformerConfig.from_hf(hf_config)
    hf.warn_if_lm_bias_ignored(source)
    state = hf.with_prefix(state, prefix)
    ours = hf.state_dict_from_hf(state, our_config.layer_backends())
    reference = next(t for t in ours.values() if t.is_floating_point())
    target = torch.device(device) if device is not None else reference.device
    model = cls(our_config, device=target, **model_kwargs)
    model.to(device=target, dtype=reference.dtype)
    model.load_state_dict({k[len(prefix) :]: v for k, v in ours.items()} if prefix else ours)
    return model.train(training)


def check_generation_length(config: ReformerConfig, n: int, new: object, use_cache: bool) -> None:
    """Raise InputError before the first token when a prompt of n tokens and `new` generated ones
    need more positions than max_position_embeddings (the last token is never fed back)."""
    if isinstance(new, bool) or not isinstance(new, int) or new < 1:
        return  # generation.generate says what max_new_tokens must be

    def needed(tokens: int) -> int:
        last = n + tokens - 1  # the longest sequence a forward reads
        if not use_cache:
            last += hf_padding(config, last)
        return max(n + hf_padding(config, n), last)

    limit = config.max_positions
    if needed(new) <= limit:
        return
    most = max(0, min(new, limit - n + 1))
    while most > 0 and needed(most) > limit:
        most -= 1
    fix = (
        f"generate at most {most} new tokens, or shorten the prompt"
        if most
        else "shorten the prompt"
    )
    what = (
        f"max_position_embeddings={limit}"
        if limit == config.max_position_embeddings
        else f"the {limit} positions of axial_pos_shape {tuple(config.axial_pos_shape)}"
    )
    raise InputError(
        f"a prompt of {n} tokens and {new} new tokens need {needed(new)} positions, more than "
        f"{what}: {fix}, or build the model with more positions"
    )


def _check_token_ids(input_ids: Tensor, vocab_size: int) -> None:
    """InputError for ids outside [0, vocab_size): the embedding would fail with an IndexError (CPU)
    or a device-side assert (CUDA). Skipped where there are no values: compiling, meta and fake
    tensors (memory prediction)."""
    if input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
        raise InputError(f"input_ids must be integer token ids, got dtype {input_ids.dtype}")
    if (
        torch.compiler.is_compiling()
        or input_ids.device.type == "meta"
        or is_fake(input_ids)
        or not input_ids.numel()
    ):
        return
    low, high = int(input_ids.min()), int(input_ids.max())
    if high >= vocab_size:
        raise InputError(
            f"input_ids hold token id {high} (the largest), but vocab_size is {vocab_size}: "
            f"ids must be in 0..{vocab_size - 1}; raise vocab_size or fix the ids"
        )
    if low < 0:
        raise InputError(f"input_ids hold token id {low}; ids must be in 0..{vocab_size - 1}")


def _padding_mask(attention_mask: Tensor | None, shape: torch.Size) -> Tensor | None:
    if attention_mask is None:
        return None
    if tuple(attention_mask.shape) != tuple(shape):
        raise ShapeError(
            f"attention_mask must have input_ids' shape {tuple(shape)} (1/True = real token), "
            f"got {tuple(attention_mask.shape)}"
        )
    return attention_mask.to(torch.bool)


def _init_weights(module: nn.Module, std: float) -> None:
    """HF's init: linear weights and token embeddings ~ N(0, std), biases 0, LayerNorm 1/0."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=std)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)


def _shortest_cycle(per_layer: list[str]) -> tuple[str, ...]:
    """The shortest attn_layers whose cycling gives `per_layer` (so configs stay readable)."""
    n = len(per_layer)
    for p in range(1, n + 1):
        if all(per_layer[i] == per_layer[i % p] for i in range(n)):
            return tuple(per_layer[:p])
    return tuple(per_layer)


__all__ = [
    "ReformerClassificationHead",
    "ReformerForSequenceClassification",
    "ReformerLM",
    "ReformerLMOutput",
    "ReformerModel",
    "ReformerOutput",
    "SequenceClassifierOutput",
    "build_layer",
]


def _projections(spec: BackendSpec, heads: int, head_dim: int) -> dict[str, int] | None:
    """The input projections `spec` makes with its default options (None: it has no defaults)."""
    try:
        return spec.layout().projections(heads, head_dim)
    except ZooError:
        return None


def _describe(sizes: dict[str, int]) -> str:
    """Projections as the block's fused map holds them, e.g. [q 256, k 256, v 256]."""
    return "[" + ", ".join(f"{name} {size}" for name, size in sizes.items()) + "]"
