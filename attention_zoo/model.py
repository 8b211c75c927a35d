"""The Reformer skeleton (Kitaev et al. 2020): embeddings, a residual stack of (attention, FFN)
layers, and a causal LM head. Which attention fills each layer, the residual variant, FFN chunking
and the position embeddings are independent fields of ReformerConfig.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention.spec import build_attention, get_backend
from .blocks.attention import SelfAttention
from .blocks.feedforward import ChunkedFeedForward
from .blocks.layer import PreNorm, ReformerLayer
from .blocks.position import AxialPositionEmbedding, TablePositionEmbedding
from .blocks.residual import RESIDUALS, StandardResidual
from .config import ReformerConfig
from .errors import ConfigError, OptionError, ShapeError

log = logging.getLogger(__name__)

IGNORE_INDEX = -100  # labels with this value add nothing to the loss (as in HF)


@dataclass
class ReformerOutput:
    """ReformerModel output: final hidden states after the last LayerNorm, (b, n, hidden)."""

    last_hidden_state: Tensor


@dataclass
class ReformerLMOutput:
    """ReformerLM output.

    logits: (b, n, vocab); loss: mean next-token cross-entropy over labels != -100 (None without
    labels); hidden_states: the (b, n, hidden) states the LM head reads.
    """

    logits: Tensor
    loss: Tensor | None = None
    hidden_states: Tensor | None = None


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
        if config.axial_pos_embds:
            self.positions: nn.Module = AxialPositionEmbedding(
                config.axial_pos_shape, config.axial_pos_embds_dim, init_std=config.axial_norm_std
            )
        else:
            self.positions = TablePositionEmbedding(
                config.max_position_embeddings,
                config.hidden_size,
                init_std=config.initializer_range,
            )
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        layers = [build_layer(config, i, device) for i in range(config.num_hidden_layers)]
        self.encoder: StandardResidual = RESIDUALS.get(config.residual)(layers)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        _init_weights(self, config.initializer_range)

    @property
    def layers(self) -> nn.ModuleList:
        return self.encoder.layers

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> ReformerOutput:
        """input_ids (b, n) long; attention_mask (b, n) bool or 0/1, 1 = real token (optional)."""
        if input_ids.dim() != 2:
            raise ShapeError(
                f"input_ids must be (batch, length), got shape {tuple(input_ids.shape)}"
            )
        n = input_ids.shape[1]
        x = self.tokens(input_ids) + self.positions(n)  # (b, n, hidden); positions check the limit
        x = self.encoder(self.dropout(x), _padding_mask(attention_mask, input_ids.shape))
        return ReformerOutput(self.norm(x))

    # ---- evaluation-time attention changes (weights kept) -------------------------------------

    def set_attention_options(self, backend: str, **options: Any) -> ReformerConfig:
        """Change `backend`'s options in every layer using it (e.g. num_hashes=8 for evaluation).

        Cores are rebuilt, projection weights kept; `self.config` is updated to say so. Returns it.
        """
        merged = {**self.config.attn_options.get(backend, {}), **options}
        config = self.config.replace(attn_options={**self.config.attn_options, backend: merged})
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
        new = get_backend(backend)
        for i in chosen:
            old = self.layers[i].attention.spec
            if old.caps.shared_qk != new.caps.shared_qk:
                layout = {True: "[qk, v] (shared QK)", False: "[q, k, v]"}
                same = _backends_with_layout(old.caps.shared_qk)
                raise OptionError(
                    f"layer {i} uses {old.name!r} with projections {layout[old.caps.shared_qk]}; "
                    f"{backend!r} needs {layout[new.caps.shared_qk]}, so the weights cannot be "
                    "kept. "
                    f"Backends with the same layout: {', '.join(same)}"
                )
            per_layer[i] = backend
        attn_layers = _shortest_cycle(per_layer)
        config = self.config.replace(attn_layers=attn_layers)
        self._rebuild_cores(config, chosen)
        return config

    def _rebuild_cores(self, config: ReformerConfig, indices: list[int]) -> None:
        backends = config.layer_backends()
        for i in indices:
            attention = self.layers[i].attention
            name = backends[i]
            core = build_attention(
                name,
                causal=config.is_decoder,
                device=self._device,
                **config.attention_options(name),
            )
            reference = next(attention.parameters())
            attention.core = core.to(device=reference.device)
            attention.spec = get_backend(name)
        self.config = config
        log.info("attention now: %s", config.layer_backends())


class ReformerLM(nn.Module):
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
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size)
        _init_weights(self.lm_head, config.initializer_range)

    @property
    def config(self) -> ReformerConfig:
        return self.reformer.config

    def forward(
        self, input_ids: Tensor, labels: Tensor | None = None, attention_mask: Tensor | None = None
    ) -> ReformerLMOutput:
        """input_ids (b, n); labels (b, n), shifted inside (position i predicts labels[i + 1]),
        -100 = ignored, usually labels = input_ids; attention_mask (b, n) bool or 0/1."""
        hidden = self.reformer(input_ids, attention_mask).last_hidden_state
        logits = self.lm_head(hidden)  # (b, n, vocab)
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

    def set_attention_options(self, backend: str, **options: Any) -> ReformerConfig:
        return self.reformer.set_attention_options(backend, **options)

    def replace_attention(self, layers: str | int | Iterable[int], backend: str) -> ReformerConfig:
        return self.reformer.replace_attention(layers, backend)

    set_attention_options.__doc__ = ReformerModel.set_attention_options.__doc__
    replace_attention.__doc__ = ReformerModel.replace_attention.__doc__


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


def _backends_with_layout(shared_qk: bool) -> list[str]:
    from .attention.spec import list_backends

    return [s.name for s in list_backends() if s.caps.shared_qk == shared_qk]


def _shortest_cycle(per_layer: list[str]) -> tuple[str, ...]:
    """The shortest attn_layers whose cycling gives `per_layer` (so configs stay readable)."""
    n = len(per_layer)
    for p in range(1, n + 1):
        if all(per_layer[i] == per_layer[i % p] for i in range(n)):
            return tuple(per_layer[:p])
    return tuple(per_layer)


__all__ = ["ReformerLM", "ReformerLMOutput", "ReformerModel", "ReformerOutput", "build_layer"]
