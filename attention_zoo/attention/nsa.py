"""NSA, natively trainable sparse attention (Yuan et al. 2025): three branches mixed by gates
computed from the hidden states, o = g_cmp o_cmp + g_slc o_slc + g_swa o_swa.

o_cmp attends to mean-pooled key and value blocks of `block_size` (the paper learns an MLP; fla
pools by mean, as here), a block once it is complete; o_slc reads `num_selected` key blocks: the
first, the previous and the query's own, and those the compressed attention's probabilities
(summed over the heads sharing a KV head) rank highest; o_swa reads the `window` latest keys
(the sliding-window backend's computation: its kernels, or with `tiled` on long inputs the
window's blocks as a route; decoding steps read the window from the cache). The gates are
sigmoids of projections of the hidden states (inputs declared as extras). Causal.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .base import AttentionCore
from .decode import BlocksState, StateShape, blocks_append, blocks_state, blocks_state_bytes
from .dispatch import Call
from .inputs import Extra, check_kv_heads, unit_sigmoid
from .kernels.masks import real_keys
from .kernels.routing.compressed import (
    compressed_attention,
    compressed_seen,
    nsa_route,
    window_route,
)
from .kernels.routing.gathered import gathered_attention
from .kernels.routing.mixed import MixedNSA, pays, plan_branches
from .kernels.routing.route import block_means
from .kernels.routing.table import ROUTED_KERNELS, Attend
from .kernels.routing.tiled import tiled_attention
from .kernels.segments import needs_grad
from .options import check_int
from .spec import ROUTED, get_backend, register_attention

GATES = ("g_cmp", "g_slc", "g_swa")  # the branches' gates, in (0, 1)
# the window branch is the built-in sliding-window backend (registered before this module, see
# attention/__init__.py): taken from the registry now, so a plugin that replaces it later does not
# change what nsa computes
WINDOW = get_backend("sliding-window")


@dataclass(frozen=True, kw_only=True)
class NSAConfig:
    """Options of NSA attention."""

    block_size: int = 64  # keys per compressed and per selected block
    num_selected: int = 8  # blocks each query reads, the first, previous and own included
    window: int = 256  # keys of the sliding-window branch (the query's and those before it)
    kernel: str = "auto"  # auto (the pick rule), tiled, gathered, flex, math
    kv_heads: int | None = None  # shared KV heads (GQA; 1: MQA); None: one per query head

    def __post_init__(self) -> None:
        check_int("block_size", self.block_size, minimum=1, backend="nsa")
        check_int("window", self.window, minimum=1, backend="nsa")
        check_int("num_selected", self.num_selected, minimum=3, backend="nsa")
        check_kv_heads("nsa", self.kv_heads)
        ROUTED_KERNELS.check_option("nsa", self.kernel)


@register_attention("nsa", config=NSAConfig, caps=ROUTED, variants=({"kv_heads": 1},))
class NSAAttention(AttentionCore):
    """NSA: gated compressed, selected-block and sliding-window branches; causal."""

    extras = tuple(Extra(name, unit_sigmoid) for name in GATES)

    def __init__(self, cfg: NSAConfig, *, causal: bool = False) -> None:
        super().__init__(cfg, causal=causal)
        # the window branch: the sliding-window core (math or flex when this core is told so)
        kernel = cfg.kernel if cfg.kernel in ("math", "flex") else "auto"
        window = WINDOW.make_config(window=cfg.window, kv_heads=cfg.kv_heads, kernel=kernel)
        self.window_core = WINDOW.cls(window, causal=True)

    def routed(
        self,
        attend: Attend,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        key_padding_mask: Tensor | None,
        **gates: Tensor,
    ) -> Tensor:
        """The three branches, the selected and window ones computed by `attend`."""
        real = real_keys(key_padding_mask, q.shape[0], q.shape[2], q.device)
        means, values, has = self._pooled(k, v, real)
        o_swa = self.window_core(q, k, v, key_padding_mask)
        # a query whose window holds no real key takes nothing from it: its gate is 0 (gating
        # the branch's output instead would keep a second copy of it for the backward)
        gates = {**gates, "g_swa": gates["g_swa"] * window_seen(real, self.cfg.window)}
        return self._mix(attend, q, k, v, real, means, values, has, gates, o_swa, 0)

    def mixed(
        self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None, **gates: Tensor
    ) -> Tensor:
        """On long inputs, the three branches in one autograd node, the window's on key-block
        tiles too (`kernels/routing/mixed.py`): one set of gradients, the branches' outputs freed
        early. On short ones, where the tiles' scratch sets the peak anyway, as `routed`."""
        cfg, (b, h, t, _) = self.cfg, q.shape
        if not pays(b * h, t, v.shape[-1]):
            return self.routed(tiled_attention, q, k, v, key_padding_mask, **gates)
        c = cfg.block_size
        real = real_keys(key_padding_mask, b, t, q.device)
        with torch.no_grad():  # the node adds the block means' gradients itself
            means, values, has = self._pooled(k, v, real)
            selected = nsa_route(q, means, has, block=c, slots=cfg.num_selected)
        window = window_route(b, h, t, block=c, window=cfg.window, offset=0, device=q.device)
        branches = plan_branches(q, k, v, selected, window, (means, values, has), real)
        g_cmp = gates["g_cmp"] * compressed_seen(has, t, block=c)  # no block seen: nothing
        g_swa = gates["g_swa"] * window_seen(real, cfg.window)
        inputs = (q, k, v, g_cmp, gates["g_slc"], g_swa)
        return MixedNSA.apply(*inputs, branches, needs_grad(*inputs))

    def _pooled(self, k: Tensor, v: Tensor, real: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The block means of the keys and of the values (b, kv, nb, d) over their real keys, and
        which blocks hold one (b, nb)."""
        means, has = block_means(k, real, self.cfg.block_size)
        values, _ = block_means(v, real, self.cfg.block_size)
        return means, values, has

    def _mix(
        self,
        attend: Attend,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        real: Tensor,
        means: Tensor,
        values: Tensor,
        has: Tensor,
        gates: dict[str, Tensor],
        o_swa: Tensor,
        offset: int,
    ) -> Tensor:
        """The gated sum for queries at positions offset.. over keys 0..: pooled blocks means and
        values (b, kv, nb, d) in the score dtype, `has` (b, nb) which hold a real key; the window
        branch's output o_swa given."""
        cfg = self.cfg
        c = cfg.block_size
        pooled_k, pooled_v = means.to(k.dtype), values.to(v.dtype)
        o_cmp, seen = compressed_attention(q, pooled_k, pooled_v, has, block=c, offset=offset)
        route = nsa_route(q, means, has, block=c, slots=cfg.num_selected, offset=offset)
        o_slc = attend(q, k, v, route, real)
        gates = {**gates, "g_cmp": gates["g_cmp"] * seen}  # no block seen: nothing from them
        g_cmp, g_slc, g_swa = (gates[name].unsqueeze(-1) for name in GATES)
        return g_cmp * o_cmp + g_slc * o_slc + g_swa * o_swa

    def route_shape(self) -> tuple[int, int]:
        """(slots, block): the key blocks a query's selected route holds, and their length."""
        return self.cfg.num_selected, self.cfg.block_size

    def idle_cores(self, call: Call, rows: int) -> tuple[nn.Module, ...]:
        """The window core, where the one node computes the window on tiles (long inputs)."""
        node = self.pick(call).name == "tiled" and pays(rows, call.length, call.head_dim)
        return (self.window_core,) if node else ()

    # ---- decoding: a KV cache and the pooled keys and values of every complete block

    def init_state(self, shape: StateShape) -> BlocksState:
        return blocks_state(shape, block=self.cfg.block_size, pool_values=True)

    def state_bytes(self, shape: StateShape) -> int:
        return blocks_state_bytes(shape, block=self.cfg.block_size, pool_values=True)

    def step(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        state: BlocksState,
        key_padding_mask: Tensor | None,
        **gates: Tensor,
    ) -> tuple[Tensor, BlocksState]:
        """New tokens against the pooled blocks completed so far, their selected blocks and their
        window, read from the cache; the prefill is the forward."""
        start, c = state.length, self.cfg.block_size
        state = blocks_append(state, k, v, key_padding_mask, block=c)
        if start == 0:
            return self.attend(q, k, v, key_padding_mask, **gates), state
        b, h, t, _ = q.shape
        near = window_route(b, h, t, block=c, window=self.cfg.window, offset=start, device=q.device)
        o_swa = gathered_attention(q, state.k, state.v, near, state.real)
        out = self._mix(
            gathered_attention, q, state.k, state.v, state.real, state.means, state.pooled_values,
            state.has, gates, o_swa, start,
        )  # fmt: skip
        return out, state


def window_seen(real: Tensor, window: int) -> Tensor:
    """(b, 1, n): whether a query's window holds a real key (else the branch gives it nothing,
    as every kernel of the routes gives a query that sees no key)."""
    count = torch.nn.functional.pad(real.long().cumsum(-1), (window, 0))
    return (count[:, window:] > count[:, :-window])[:, None, :]


def _mixed(core: NSAAttention, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, **gates):
    return core.mixed(q, k, v, mask, **gates)


# on key-block tiles, long inputs run the three branches as one node (`mixed`)
NSAAttention.kernels = ROUTED_KERNELS.replacing(
    "tiled",
    run=_mixed,
    summary="key-block tiles for the selected blocks; on long inputs the three branches in "
    "one autograd node, the window on tiles too, one set of gradients",
)
