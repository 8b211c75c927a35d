"""Small Reformer configs for tests; a skip for mixes whose backends are not registered yet."""

from __future__ import annotations

from typing import Any

import pytest

from attention_zoo import ReformerConfig
from attention_zoo.attention.spec import BACKENDS

RESIDUAL_NAMES = ["standard", "checkpoint", "reversible"]
MIXES = [("full",), ("local",), ("lsh",), ("local", "lsh")]


def need(*backends: str) -> None:
    """Skip the test unless every backend is registered (local/lsh may not be registered yet)."""
    missing = [b for b in backends if b not in BACKENDS]
    if missing:
        pytest.skip(
            f"backend(s) {', '.join(missing)} not registered yet "
            f"(registered: {', '.join(BACKENDS.names())})"
        )


def tiny_config(**overrides: Any) -> ReformerConfig:
    """A few thousand parameters; local/lsh chunks of 4 so that 2-3 chunks cover a test sequence."""
    base: dict[str, Any] = {
        "vocab_size": 13,
        "hidden_size": 16,
        "num_attention_heads": 2,
        "num_hidden_layers": 3,
        "attn_layers": ("full",),
        "feed_forward_size": 24,
        "is_decoder": True,
        "hidden_dropout_prob": 0.0,
        "axial_pos_shape": (4, 8),
        "axial_pos_embds_dim": (6, 10),
        "max_position_embeddings": 32,
        "local_attn_chunk_length": 4,
        "lsh_attn_chunk_length": 4,
        "num_buckets": 4,
        "num_hashes": 2,
    }
    base.update(overrides)
    if any(b in ("local", "lsh") for b in base["attn_layers"]):
        need(*[b for b in base["attn_layers"] if b in ("local", "lsh")])
    return ReformerConfig(**base)
