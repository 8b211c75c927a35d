"""Hugging Face transformers' LSHSelfAttention and LocalSelfAttention as peers (`hf:lsh`,
`hf:local`), each with the output projection HF's ReformerAttention adds: their options and
builders (table.py registers them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from .spec import PeerCase, resolve_buckets


@dataclass(frozen=True, kw_only=True)
class HFLSHOptions:
    """Options of transformers' LSHSelfAttention (names as our lsh's)."""

    num_hashes: int = 1
    num_buckets: int | tuple[int, int] | list[int] | None = None  # None: our lsh's rule
    chunk_length: int = 64
    num_chunks_before: int = 1
    num_chunks_after: int = 0
    seed: int | None = None  # HF's hash_seed


@dataclass(frozen=True, kw_only=True)
class HFLocalOptions:
    """Options of transformers' LocalSelfAttention (names as our local's)."""

    chunk_length: int = 64
    num_chunks_before: int = 1
    num_chunks_after: int = 0


class HFBlock(nn.Module):
    """A transformers self-attention module plus the output projection that its
    ReformerAttention adds (Linear(inner, hidden), no bias), as our SelfAttention block has."""

    def __init__(self, attention: nn.Module, inner: int, hidden: int) -> None:
        super().__init__()
        self.attention = attention
        self.out = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """(b, n, hidden) -> (b, n, hidden)."""
        return self.out(self.attention(x).hidden_states)


def _hf_config(case: PeerCase, **fields: Any) -> Any:
    from transformers import ReformerConfig

    return ReformerConfig(
        hidden_size=case.hidden,
        num_attention_heads=case.num_heads,
        attention_head_size=case.head_dim,
        is_decoder=case.causal,
        max_position_embeddings=case.seq_len,
        lsh_attention_probs_dropout_prob=0.0,
        local_attention_probs_dropout_prob=0.0,
        hidden_dropout_prob=0.0,
        **fields,
    )


def build_hf_lsh(case: PeerCase, options: HFLSHOptions) -> nn.Module:
    from transformers.models.reformer.modeling_reformer import LSHSelfAttention

    config = _hf_config(
        case,
        num_hashes=options.num_hashes,
        num_buckets=resolve_buckets(case.seq_len, options.chunk_length, options.num_buckets),
        hash_seed=options.seed,
        lsh_attn_chunk_length=options.chunk_length,
        lsh_num_chunks_before=options.num_chunks_before,
        lsh_num_chunks_after=options.num_chunks_after,
    )
    return HFBlock(LSHSelfAttention(config), case.num_heads * case.head_dim, case.hidden)


def build_hf_local(case: PeerCase, options: HFLocalOptions) -> nn.Module:
    from transformers.models.reformer.modeling_reformer import LocalSelfAttention

    config = _hf_config(
        case,
        local_attn_chunk_length=options.chunk_length,
        local_num_chunks_before=options.num_chunks_before,
        local_num_chunks_after=options.num_chunks_after,
    )
    return HFBlock(LocalSelfAttention(config), case.num_heads * case.head_dim, case.hidden)
