"""MoBA, mixture of block attention (Lu et al. 2025, MoonshotAI/MoBA): each query attends to the
top_k key blocks whose mean key scores highest against it, its own block always, causally.

Keys are cut into blocks of `block_size`. A query in block i scores every earlier block by
q . mean(k_block) (float32 at least); blocks after i are excluded, block i is always chosen
(causal inside it), and the top_k - 1 best earlier blocks join it; one softmax over their union.
top_k = 1 attends its own block only (MoBA's naive version; its efficient one falls back to full
attention there); top_k >= the number of blocks is causal full attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .base import AttentionCore
from .decode import BlocksState, StateShape, blocks_append, blocks_state, blocks_state_bytes
from .inputs import check_kv_heads
from .kernels.masks import real_keys
from .kernels.routing.gathered import gathered_attention
from .kernels.routing.route import ROUTE_BYTES, Route, block_means, top_blocks
from .kernels.routing.table import ROUTED_KERNELS, Attend
from .options import check_int
from .spec import ROUTED, register_attention


@dataclass(frozen=True, kw_only=True)
class MoBAConfig:
    """Options of MoBA attention."""

    block_size: int = 64  # keys per block
    top_k: int = 8  # blocks each query attends, its own included
    kernel: str = "auto"  # auto (the pick rule), tiled, gathered, flex, math
    kv_heads: int | None = None  # shared KV heads (GQA; 1: MQA); None: one per query head

    def __post_init__(self) -> None:
        check_int("block_size", self.block_size, minimum=1, backend="moba")
        check_int("top_k", self.top_k, minimum=1, backend="moba")
        check_kv_heads("moba", self.kv_heads)
        ROUTED_KERNELS.check_option("moba", self.kernel)


def moba_route(
    q: Tensor, means: Tensor, has: Tensor, *, block: int, top_k: int, offset: int = 0
) -> Route:
    """The blocks of queries q (b, h, t, d) at positions offset..: their own and the top_k - 1
    earlier blocks (with a real key, `has` (b, nb)) by q . mean key (means (b, kv, nb, d))."""
    b, h, t, d = q.shape
    kv, nb = means.shape[1], means.shape[2]
    step = max(1, ROUTE_BYTES // (b * h * nb * 4))
    own = torch.arange(offset, offset + t, device=q.device) // block
    picks, used = [], []
    with torch.no_grad():  # indices only
        for s in range(0, t, step):  # bounds the (queries, blocks) scores held at once
            e = min(s + step, t)
            q_s = q[:, :, s:e].to(means.dtype).reshape(b, kv, -1, e - s, d)
            scores = torch.matmul(q_s, means.unsqueeze(2).transpose(-1, -2)).reshape(b, h, -1, nb)
            earlier = torch.arange(nb, device=q.device) < own[s:e, None]
            scores = scores.masked_fill(~(earlier & has[:, None, None, :]), float("-inf"))
            idx, ok = top_blocks(scores, top_k - 1)
            picks.append(idx)
            used.append(ok)
    mine = own.expand(b, h, t)[..., None]
    blocks = torch.cat([mine, torch.cat(picks, dim=2)], dim=-1)
    used = torch.cat([torch.ones_like(mine, dtype=torch.bool), torch.cat(used, dim=2)], dim=-1)
    return Route(blocks, used, block, offset)


@register_attention("moba", config=MoBAConfig, caps=ROUTED, variants=({"kv_heads": 1},))
class MoBAAttention(AttentionCore):
    """MoBA: each query's top-k key blocks by mean key, its own always; causal."""

    def routed(
        self, attend: Attend, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None
    ) -> Tensor:
        """The route of every query, computed by `attend` (an implementation)."""
        real = real_keys(key_padding_mask, q.shape[0], q.shape[2], q.device)
        means, has = block_means(k, real, self.cfg.block_size)
        route = moba_route(q, means, has, block=self.cfg.block_size, top_k=self.cfg.top_k)
        return attend(q, k, v, route, real)

    def route_shape(self) -> tuple[int, int]:
        """(slots, block): the key blocks a query's route holds, and their length."""
        return self.cfg.top_k, self.cfg.block_size

    # ---- decoding: a KV cache and the mean key of every complete block

    def init_state(self, shape: StateShape) -> BlocksState:
        return blocks_state(shape, block=self.cfg.block_size)

    def state_bytes(self, shape: StateShape) -> int:
        return blocks_state_bytes(shape, block=self.cfg.block_size)

    def step(
        self, q: Tensor, k: Tensor, v: Tensor, state: BlocksState, key_padding_mask: Tensor | None
    ) -> tuple[Tensor, BlocksState]:
        """New tokens route over the complete blocks' mean keys and read their blocks from the
        cache: a fixed number of keys at any length; the prefill is the forward."""
        start, c = state.length, self.cfg.block_size
        state = blocks_append(state, k, v, key_padding_mask, block=c)
        if start == 0:
            return self.attend(q, k, v, key_padding_mask), state
        route = moba_route(q, state.means, state.has, block=c, top_k=self.cfg.top_k, offset=start)
        return gathered_attention(q, state.k, state.v, route, state.real), state


MoBAAttention.kernels = ROUTED_KERNELS
