"""Hugging Face Reformer checkpoints in and out: config fields, state-dict names, files on disk.

What HF computes is reproduced by the model (concatenated streams, HF's axial layout, padding to the
chunk lengths) and by the cores' `semantics="hf"`; this module only translates names and values.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .attention.spec import get_backend
from .errors import ConfigError

HF_ATTENTION = ("local", "lsh")  # the attention types HF's Reformer knows
HF_SEMANTICS = {"semantics": "hf"}  # core option for transformers' LSH/local attention

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

# HF config fields that ReformerConfig has under the same name and meaning.
SAME_FIELDS = (
    "attention_head_size",
    "attn_layers",
    "axial_norm_std",
    "axial_pos_embds",
    "axial_pos_embds_dim",
    "axial_pos_shape",
    "chunk_size_feed_forward",
    "chunk_size_lm_head",
    "feed_forward_size",
    "hash_seed",
    "hidden_act",
    "hidden_dropout_prob",
    "hidden_size",
    "initializer_range",
    "is_decoder",
    "layer_norm_eps",
    "local_attention_probs_dropout_prob",
    "local_attn_chunk_length",
    "local_num_chunks_after",
    "local_num_chunks_before",
    "lsh_attention_probs_dropout_prob",
    "lsh_attn_chunk_length",
    "lsh_num_chunks_after",
    "lsh_num_chunks_before",
    "max_position_embeddings",
    "num_attention_heads",
    "num_buckets",
    "num_hashes",
    "pad_token_id",
    "vocab_size",
)


class HFConversionWarning(UserWarning):
    """A Hugging Face field kept only for to_hf(), or a value HF and this model use differently."""


def read_hf_config(source: Any) -> dict[str, Any]:
    """A plain dict from a transformers config, a dict, or a path to config.json (or its folder)."""
    if hasattr(source, "to_dict") and not isinstance(source, Mapping):
        data = source.to_dict()
    elif isinstance(source, Mapping):
        data = dict(source)
    elif isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise ConfigError(
                f"no Hugging Face config at {path}; give a config.json, the folder holding it, "
                "a dict or a transformers ReformerConfig"
            )
        data = json.loads(path.read_text())
    else:
        raise ConfigError(
            "from_hf takes a transformers ReformerConfig, a dict, or a path to config.json "
            f"(or its folder), got {type(source).__name__}"
        )
    return data


def translate_config(data: Mapping[str, Any]) -> dict[str, Any]:
    """HF config dict -> ReformerConfig fields; refuses what HF itself would not run."""
    model_type = data.get("model_type", "reformer")
    if model_type != "reformer":
        raise ConfigError(f"not a Reformer config: model_type is {model_type!r}, not 'reformer'")
    if data.get("is_encoder_decoder"):
        raise ConfigError("is_encoder_decoder=True: HF's Reformer is an encoder or a decoder only")
    attn_layers = tuple(data.get("attn_layers", ("local", "lsh") * 3))
    unknown = sorted(set(attn_layers) - set(HF_ATTENTION))
    if unknown or not attn_layers:
        raise ConfigError(
            f"attn_layers {list(attn_layers)}: HF's Reformer takes a non-empty list of 'local' and "
            f"'lsh' (got {', '.join(map(repr, unknown)) or 'none'})"
        )
    if not isinstance(data.get("hidden_act", "relu"), str):
        raise ConfigError(
            f"hidden_act {data['hidden_act']!r} is a function; only activation names can be loaded"
        )
    fields = {name: data[name] for name in SAME_FIELDS if name in data}
    fields["attn_layers"] = attn_layers
    fields["num_hidden_layers"] = len(attn_layers)  # HF: always len(attn_layers)
    stated = data.get("num_hidden_layers", len(attn_layers))
    if stated != len(attn_layers):
        warnings.warn(
            f"num_hidden_layers={stated} ignored: HF builds len(attn_layers) = {len(attn_layers)} "
            "layers, and so does this model",
            HFConversionWarning,
            stacklevel=3,
        )
    for name in ("axial_pos_shape", "axial_pos_embds_dim", "num_buckets"):
        if isinstance(fields.get(name), list):
            fields[name] = tuple(fields[name])
    # HF defaults that differ from ours, made explicit so the model is HF's model.
    fields.setdefault("num_attention_heads", 12)
    fields.setdefault("attention_head_size", 64)
    fields.setdefault("axial_norm_std", 1.0)
    fields.setdefault("local_attention_probs_dropout_prob", 0.05)
    fields.setdefault("lsh_attention_probs_dropout_prob", 0.0)
    fields["attention_probs_dropout_prob"] = 0.0  # only local/lsh layers: their own fields apply
    fields["residual"] = "reversible"
    options = {
        b: dict(HF_SEMANTICS) for b in HF_ATTENTION if b in attn_layers and _takes_semantics(b)
    }
    missing = [b for b in dict.fromkeys(attn_layers) if not _takes_semantics(b)]
    if missing:
        warnings.warn(
            f"the {', '.join(missing)} core(s) have no semantics='hf' option here: their exact "
            "semantics are used, so outputs differ from transformers'",
            HFConversionWarning,
            stacklevel=3,
        )
    fields["attn_options"] = options
    extra = {
        k: v for k, v in data.items() if k not in SAME_FIELDS and k not in ("num_hidden_layers",)
    }
    extra.pop("model_type", None)
    kept = sorted(k for k in extra if not k.startswith("_") and k != "transformers_version")
    if kept:
        warnings.warn(
            "Hugging Face field(s) kept for to_hf() only, they change nothing computed here "
            f"(tokenizer, generation, output format or bookkeeping): {', '.join(kept)}",
            HFConversionWarning,
            stacklevel=3,
        )
    fields["hf_extra"] = extra
    return fields


def _takes_semantics(backend: str) -> bool:
    return "semantics" in get_backend(backend).defaults()


# ---- state dicts ---------------------------------------------------------------------------------

_LAYER = re.compile(r"^reformer\.encoder\.layers\.(\d+)\.(.+)$")
_LAYER_NAMES = {  # HF name inside a layer -> ours inside `reformer.encoder.layers.i.`
    "attention.layer_norm.weight": "f.norm.weight",
    "attention.layer_norm.bias": "f.norm.bias",
    "attention.output.dense.weight": "f.fn.out_proj.weight",
    "feed_forward.layer_norm.weight": "g.norm.weight",
    "feed_forward.layer_norm.bias": "g.norm.bias",
    "feed_forward.dense.dense.weight": "g.fn.dense.weight",
    "feed_forward.dense.dense.bias": "g.fn.dense.bias",
    "feed_forward.output.dense.weight": "g.fn.out.weight",
    "feed_forward.output.dense.bias": "g.fn.out.bias",
}
_PROJECTIONS = {  # the fused in_proj rows, in order
    "lsh": ("query_key", "value"),
    "local": ("query", "key", "value"),
}
_TOP_NAMES = {
    "reformer.embeddings.word_embeddings.weight": "reformer.tokens.weight",
    "reformer.embeddings.position_embeddings.embedding.weight": "reformer.positions.weight",
    "reformer.encoder.layer_norm.weight": "reformer.norm.weight",
    "reformer.encoder.layer_norm.bias": "reformer.norm.bias",
    "lm_head.decoder.weight": "lm_head.weight",
    "lm_head.bias": "lm_head.bias",
}
_HEADS = ("classifier.",)  # head weights HF and this package name alike (sequence classification)
_AXIAL = re.compile(r"^reformer\.embeddings\.position_embeddings\.weights\.(\d+)$")


def state_dict_from_hf(
    hf_state: Mapping[str, Tensor], layer_backends: list[str]
) -> dict[str, Tensor]:
    """HF ReformerModelWithLMHead state dict -> ReformerLM state dict (same tensors, renamed)."""
    hf_state = dict(hf_state)
    # The head's bias is the decoder's where it has one (transformers 4.x: tied to lm_head.bias;
    # 5.24 on: applied, lm_head.bias left unused), else lm_head.bias.
    decoder_bias = hf_state.pop("lm_head.decoder.bias", None)
    if decoder_bias is not None:
        hf_state["lm_head.bias"] = decoder_bias
    ours: dict[str, Tensor] = {}
    projections: dict[int, dict[str, Tensor]] = {}
    unexpected = []
    for name, tensor in hf_state.items():
        if name in _TOP_NAMES:
            ours[_TOP_NAMES[name]] = tensor
        elif name.startswith(_HEADS):
            ours[name] = tensor
        elif m := _AXIAL.match(name):
            ours[f"reformer.positions.weights.{m.group(1)}"] = tensor
        elif m := _LAYER.match(name):
            i, rest = int(m.group(1)), m.group(2)
            if rest in _LAYER_NAMES:
                ours[f"reformer.encoder.layers.{i}.{_LAYER_NAMES[rest]}"] = tensor
            elif rest.startswith("attention.self_attention.") and rest.endswith(".weight"):
                part = rest[len("attention.self_attention.") : -len(".weight")]
                projections.setdefault(i, {})[part] = tensor
            else:
                unexpected.append(name)
        else:
            unexpected.append(name)
    for i, parts in sorted(projections.items()):
        if i >= len(layer_backends):
            unexpected += [
                f"reformer.encoder.layers.{i}.attention.self_attention.{p}" for p in parts
            ]
            continue
        order = _PROJECTIONS[layer_backends[i]]
        if sorted(parts) != sorted(order):
            raise ConfigError(
                f"layer {i} is {layer_backends[i]!r} (projections {', '.join(order)}), but the HF "
                f"state dict has {', '.join(sorted(parts))}: attn_layers does not match the weights"
            )
        ours[f"reformer.encoder.layers.{i}.f.fn.in_proj.weight"] = torch.cat(
            [parts[p] for p in order]
        )
    if unexpected:
        raise ConfigError(
            f"HF state dict has names a ReformerModelWithLMHead does not: {', '.join(unexpected)}"
        )
    return ours


def state_dict_to_hf(state: Mapping[str, Tensor], layer_backends: list[str]) -> dict[str, Tensor]:
    """ReformerLM state dict -> HF ReformerModelWithLMHead state dict (exact inverse)."""
    top = {ours: hf for hf, ours in _TOP_NAMES.items()}
    layer = {ours: hf for hf, ours in _LAYER_NAMES.items()}
    out: dict[str, Tensor] = {}
    for name, tensor in state.items():
        if name in top:
            out[top[name]] = tensor
        elif name.startswith(_HEADS):
            out[name] = tensor
        elif m := re.match(r"^reformer\.positions\.weights\.(\d+)$", name):
            out[f"reformer.embeddings.position_embeddings.weights.{m.group(1)}"] = tensor
        elif m := re.match(r"^reformer\.encoder\.layers\.(\d+)\.(.+)$", name):
            i, rest = int(m.group(1)), m.group(2)
            prefix = f"reformer.encoder.layers.{i}."
            if rest == "f.fn.in_proj.weight":
                order = _PROJECTIONS[layer_backends[i]]
                for part, rows in zip(order, tensor.chunk(len(order))):
                    out[f"{prefix}attention.self_attention.{part}.weight"] = rows
            elif rest in layer:
                out[prefix + layer[rest]] = tensor
            else:
                raise ConfigError(f"{name} has no place in HF's Reformer")
        else:
            raise ConfigError(f"{name} has no place in HF's Reformer")
    return out


def load_weights(folder: Path) -> dict[str, Tensor]:
    """The state dict saved in a Hugging Face model folder (safetensors or pytorch_model.bin)."""
    safetensors_file = folder / "model.safetensors"
    bin_file = folder / "pytorch_model.bin"
    if safetensors_file.is_file():
        from safetensors.torch import load_file

        return load_file(str(safetensors_file))
    if bin_file.is_file():
        return torch.load(bin_file, map_location="cpu", weights_only=True)
    found = ", ".join(sorted(p.name for p in folder.iterdir())) or "(empty)"
    raise ConfigError(
        f"no weights in {folder}: expected model.safetensors or pytorch_model.bin "
        f"(one file, not sharded); found: {found}"
    )


# ---- HF models and sources in and out ---------------------------------------------------------


def read_source(source: Any, config: Any) -> tuple[Any, Mapping[str, Tensor], bool]:
    """(HF config, HF state dict, training) of a from_hf source: an HF model, its state dict with
    `config`, or a local folder with config.json and its weights."""
    if isinstance(source, nn.Module):
        return source.config, source.state_dict(), source.training
    if isinstance(source, Mapping):
        if config is None:
            raise ConfigError(
                "from_hf(state_dict) needs config=: the HF config, its dict or config.json"
            )
        return config, source, False
    folder = Path(source)
    if not folder.is_dir():
        raise ConfigError(
            f"{source} is not a folder; from_hf takes an HF model, a state dict (with "
            "config=) or a folder with config.json and model weights"
        )
    return config or folder, load_weights(folder), False


def warn_if_lm_bias_ignored(source: Any) -> None:
    """Warn (at from_hf's caller) when the HF model ignores an lm_head.bias our model adds."""
    head = getattr(source, "lm_head", None)
    if head is not None and head.decoder.bias is None and head.bias.detach().abs().max() > 0:
        warnings.warn(
            "this transformers version ignores lm_head.bias (its decoder has no bias); the loaded "
            "model adds it, as trained (transformers 4.x, trax): logits differ by that bias",
            HFConversionWarning,
            stacklevel=4,
        )


_CLASSIFIER = "ReformerForSequenceClassification"


def with_prefix(state: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """HF names under `prefix` ("reformer." for the encoder); a state dict already under it (an HF
    model with a head) keeps its names, its head's weights dropped with a warning."""
    if not prefix or not any(k.startswith(prefix) for k in state):
        return {prefix + k: v for k, v in state.items()}
    heads = {"lm_head.": ("LM head", "ReformerLM"), "classifier.": ("classifier", _CLASSIFIER)}
    for start, (what, loader) in heads.items():
        if names := sorted(k for k in state if k.startswith(start)):
            warnings.warn(
                f"ReformerModel.from_hf ignores the {what}'s weights ({', '.join(names)}); "
                f"{loader}.from_hf loads them",
                HFConversionWarning,
                stacklevel=4,
            )
    return {k: v for k, v in state.items() if not k.startswith(tuple(heads))}


def classifier_fields(source: Any, config: Any) -> dict[str, Any]:
    """num_labels (from the head's weights) and classifier_dropout of an HF sequence classifier
    source (sources as read_source)."""
    state = source.state_dict() if isinstance(source, nn.Module) else source
    if isinstance(state, Mapping):
        num_labels = state["classifier.out_proj.weight"].shape[0]
    else:
        num_labels = load_weights(Path(source))["classifier.out_proj.weight"].shape[0]
    hf_config = source.config if isinstance(source, nn.Module) else config or source
    dropout = read_hf_config(hf_config).get("classifier_dropout")
    return {"num_labels": num_labels, "classifier_dropout": dropout}


def to_hf(model: nn.Module, hf_class: type, prefix: str, **hf_fields: Any) -> Any:
    """`model` as an instance of `hf_class`; `hf_fields` set HF config fields (e.g. num_labels)."""
    from transformers import ReformerConfig as HFReformerConfig

    backends = model.config.layer_backends()
    data = model.config.hf_fields()
    if "num_labels" in hf_fields:  # HF derives it from id2label: a stale one would override it
        data.pop("id2label", None), data.pop("label2id", None)
    hf_model = hf_class(HFReformerConfig(**{**data, **hf_fields}))
    reference = next(model.parameters())
    hf_model.to(device=reference.device, dtype=reference.dtype)
    state = {prefix + k: v for k, v in model.state_dict().items()}
    converted = state_dict_to_hf(state, backends)
    if "lm_head.bias" in converted and "lm_head.decoder.bias" in hf_model.state_dict():
        converted["lm_head.decoder.bias"] = converted["lm_head.bias"]  # the bias it applies
    hf_model.load_state_dict({k[len(prefix) :]: v for k, v in converted.items()})
    return hf_model.train(model.training)
