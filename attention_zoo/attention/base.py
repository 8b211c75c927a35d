"""The contract every attention core keeps: its declared inputs (q, k, v (b, h, n, d) by default;
see inputs.py) in, (b, h, n, d_v) out, checked input."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..errors import OptionError, ShapeError
from .dispatch import AUTO, Call, Check, Implementation, KernelTable, cpu_fused, materialised
from .inputs import Extra, InputLayout, default_layout
from .kernels.autocast import autocast_dtype, in_dtype
from .kernels.dense import allowed_mask
from .kernels.flex import TileMasks, tile_masks

# the mask values and pattern type live with the kernels; cores and plugins import them here
from .kernels.masks import MaskMod as MaskMod
from .kernels.masks import mask_value as mask_value
from .kernels.masks import self_mask_value as self_mask_value
from .kernels.patterns.flex_pattern import FLEX
from .spec import Capabilities
from .state import CACHED, DecodeState, StateShape

SEMANTICS = ("exact", "hf")


def check_dropout(backend: str, p: object) -> None:
    """Raise OptionError unless p is an attention-probability dropout rate in [0, 1)."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < 1:
        raise OptionError(f"{backend} option dropout must be a float in [0, 1), got {p!r}")


def check_semantics(backend: str, semantics: object) -> None:
    if semantics not in SEMANTICS:
        raise OptionError(
            f"{backend} semantics {semantics!r} is not one of: {', '.join(SEMANTICS)} "
            "(hf = as transformers' Reformer computes it)"
        )


def semantics_caps(caps: Capabilities, semantics: str, **under_hf: bool) -> Capabilities:
    """The capabilities under `semantics`: as registered for exact, with `under_hf` replaced for
    hf (what transformers computes gives up some of them)."""
    return dataclasses.replace(caps, **under_hf) if semantics == "hf" else caps


def check_qkv(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_padding_mask: Tensor | None,
    layout: InputLayout | None = None,
    extras: dict[str, Tensor] | None = None,
) -> None:
    """Raise ShapeError unless q, k, v are rank-4 tensors of one floating dtype with the layout's
    heads and widths (default: one shape) and extras, and the mask is (b, n) bool."""
    for label, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise ShapeError(f"{label} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ShapeError(
                f"{label} must have rank 4 (batch, heads, length, head_dim), "
                f"got shape {tuple(t.shape)}"
            )
    if layout is None or layout.plain:
        if not (q.shape == k.shape == v.shape):
            raise ShapeError(
                "q, k and v must have the same (batch, heads, length, head_dim) shape, got "
                f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
            )
    if layout is not None:
        layout.check(q, k, v, extras or {})
    elif extras:
        raise ShapeError(f"this core takes no extra inputs, got [{', '.join(sorted(extras))}]")
    if not (q.dtype == k.dtype == v.dtype):
        raise ShapeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.dtype.is_floating_point:
        raise ShapeError(
            f"q, k and v must have a floating-point dtype (float32, float64, bfloat16, float16), "
            f"got {q.dtype}"
        )
    check_key_padding_mask(key_padding_mask, q.shape[0], q.shape[2])


def check_key_padding_mask(key_padding_mask: Tensor | None, b: int, n: int) -> None:
    """Raise ShapeError unless the mask is None or (b, n) bool."""
    if key_padding_mask is None:
        return
    if key_padding_mask.shape != (b, n) or key_padding_mask.dtype != torch.bool:
        raise ShapeError(
            f"key_padding_mask must be a bool tensor of shape (batch, length) = ({b}, {n}) "
            f"with True for real tokens, "
            f"got {key_padding_mask.dtype} {tuple(key_padding_mask.shape)}"
        )


@dataclass(frozen=True)
class BlockWeights:
    """The attention block's linear maps, for a core that folds them into its own products:
    q, k, v = x w_q^T, x w_k^T, x w_v^T split into heads, output = heads merged @ w_out^T."""

    w_q: Tensor  # (heads * head_size, hidden)
    w_k: Tensor
    w_v: Tensor
    w_out: Tensor  # (hidden, heads * head_size)
    heads: int

    def per_head(self, w: Tensor) -> Tensor:
        """An input map (heads * head_size, hidden) as (heads, head_size, hidden)."""
        return w.view(self.heads, -1, w.shape[-1])


class AttentionCore(nn.Module):
    """Base class of the attention cores: validates input, then runs the implementation the pick
    rule chooses (`kernels`, see dispatch.py).

    A built-in core declares its implementations in `kernels` and leaves `attend` to them. A core
    with its own `attend` (a plugin) keeps the default table: its attend, and FlexAttention under
    its `mask_mod` where its capabilities say it is a fixed pattern (the auto choice on CUDA)."""

    spec: Any  # set by @register_attention
    kernels: ClassVar[KernelTable]  # set below: the own-attend table
    extras: ClassVar[tuple[Extra, ...]] = ()  # inputs besides q, k, v (decays, step sizes)
    # its decoding step reads positions from its plain KV cache (key_positions, new_positions),
    # so it also decodes on one counted on the device (decode.static_cache: what a graph replays)
    cache_positions: ClassVar[bool] = False

    def __init__(self, cfg: Any, *, causal: bool = False) -> None:
        super().__init__()
        self.cfg = cfg
        self.causal = causal
        self._block_masks: dict[tuple[Any, ...], Any] = {}  # flex block masks, per length
        spec = getattr(type(self), "spec", None)  # its capabilities with these options
        refine = getattr(cfg, "capabilities", None)
        self.capabilities = None if spec is None else refine(spec.caps) if refine else spec.caps
        shared_qk = self.capabilities is not None and self.capabilities.shared_qk
        self.layout = type(self).input_layout(cfg, shared_qk)
        self._picks: dict[Call, Implementation] = {}  # the pick rule's answers

    @classmethod
    def input_layout(cls, cfg: Any, shared_qk: bool) -> InputLayout:
        """The inputs this core takes with options `cfg` (see inputs.py): by default q, k, v,
        the `kv_heads` option where the config has one, and the class's `extras`."""
        layout = default_layout(cfg, shared_qk)
        return InputLayout(layout.shared_qk, layout.kv_heads, extras=cls.extras)

    def allowed(self, q: Tensor, key_padding_mask: Tensor | None) -> Tensor | None:
        """The dense (query, key) mask of a call on q: causal where the core is, real keys only
        (None: every pair allowed)."""
        return allowed_mask(
            q.shape[-2], causal=self.causal, key_padding_mask=key_padding_mask, device=q.device
        )

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        key_padding_mask: Tensor | None = None,
        **extras: Tensor,
    ) -> Tensor:
        """q (b, h, n, d), k (b, kv, n, d), v (b, kv, n, d_v) and the declared extras ->
        (b, h, n, d_v); key_padding_mask (b, n) bool, True = real token; under autocast, computed
        in its dtype with autocast off (kernels/autocast.py)."""
        check_qkv(q, k, v, key_padding_mask, self.layout, extras)
        if (dtype := autocast_dtype(q)) is not None:
            q, k, v, extras = in_dtype(dtype, q, k, v, extras)
            with torch.autocast(q.device.type, enabled=False):
                return self.forward(q, k, v, key_padding_mask, **extras)
        if type(self).kernels is OWN_KERNELS:  # its own attend, or flex standing in for it
            impl = self.kernel_for(q, key_padding_mask, k)
            return impl.run(self, q, k, v, key_padding_mask, **extras)
        return self.attend(q, k, v, key_padding_mask, **extras)

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None, **extras: Tensor
    ) -> Tensor:
        """The picked implementation's output (a plugin overrides it)."""
        if type(self).kernels is OWN_KERNELS:
            raise NotImplementedError(f"{type(self).__name__} must define attend()")
        impl = self.kernel_for(q, key_padding_mask, k)
        return impl.run(self, q, k, v, key_padding_mask, **extras)

    @property
    def requested_kernel(self) -> str:
        """The `kernel` option: an implementation's name, or auto. A core with its own attend may
        have a `kernel` option of its own: a value the table does not name is its attend's."""
        kernel = getattr(self.cfg, "kernel", AUTO)
        if type(self).kernels is OWN_KERNELS and kernel not in OWN_KERNELS.names:
            return OWN.name
        return kernel

    def kernel_for(
        self, q: Tensor, key_padding_mask: Tensor | None = None, k: Tensor | None = None
    ) -> Implementation:
        """The implementation that computes a call on q (b, h, n, d) (and keys k) now."""
        masked = key_padding_mask is not None
        group = 1 if k is None else q.shape[1] // k.shape[1]
        return self.pick(Call.of(q, q.shape[-1], self.dropout_p, masked, group))

    def pick(self, call: Call) -> Implementation:
        """The implementation that computes `call`: the one rule (dispatch.py), decided
        once per kind of call."""
        if not torch.compiler.is_compiling() and call in self._picks:
            return self._picks[call]
        spec = getattr(type(self), "spec", None)
        backend = spec.name if spec is not None else type(self).__name__
        impl = type(self).kernels.pick(backend, self.requested_kernel, self, call)
        if not torch.compiler.is_compiling():
            self._picks[call] = impl
        return impl

    def capture_obstacle(self, call: Call, mode: str) -> str | None:
        """Why a CUDA graph cannot capture this core's `call` in a step of `mode` (a bench
        mode), or None: the built-in kernels launch from tensors alone; a core with its own
        attend says nothing of it until it overrides this."""
        if type(self).kernels is OWN_KERNELS:
            return "its own attend does not say it can be captured (capture_obstacle)"
        return None

    def idle_cores(self, call: Call, rows: int) -> tuple[nn.Module, ...]:
        """The inner cores a call with `rows` = batch x query heads does not run, so the kernels
        a case reports leave them out; by default none."""
        return ()

    def attend_block(
        self, x: Tensor, weights: BlockWeights, key_padding_mask: Tensor | None
    ) -> Tensor | None:
        """The block's output (b, n, hidden) from its input x (b, n, hidden) where this core
        computes the same function with the block's linear maps folded into its own products
        (fewer FLOPs); None (the default): the block projects q, k, v and calls `forward`."""
        return None

    def mask_mod(self, n: int, device: torch.device | str = "cpu") -> MaskMod | None:
        """This core's fixed pattern at length n, causality included, before key padding; None
        when it has none (full attention, or a pattern that depends on the inputs)."""
        return None

    def pattern(self, n: int, device: torch.device | str = "cpu") -> Tensor | None:
        """(n, n) bool, True where query i may attend to key j; None without a fixed pattern.

        A backend whose capabilities say `fixed_pattern` equals a dense softmax under this mask
        (and the key padding mask) on every query that sees at least one key."""
        mod = self.mask_mod(n, device)
        if mod is None:
            return None
        i = torch.arange(n, device=device)
        return mod(i[:, None], i[None, :])

    def key_tiles(self, n: int, device: torch.device) -> Tensor | None:
        """(query tiles, K) long: for each query tile of `kernels.flex.TILE` positions, key tiles
        that hold every key its pattern allows (-1: none); None: any tile may (all are checked)."""
        return None

    def tile_masks(self, n: int, device: torch.device) -> TileMasks:
        """FlexAttention's block masks of this core's pattern at length n, built once per device."""
        key = ("pattern", n, str(device))
        if key not in self._block_masks:
            mod = self.mask_mod(n, device)
            if mod is None:
                raise ValueError(f"{type(self).__name__} has no fixed pattern at length {n}")
            self.keep_block_mask(key, tile_masks(mod, n, self.key_tiles(n, device), device))
        return self._block_masks[key]

    def keep_block_mask(self, key: tuple[Any, ...], block_mask: Any) -> None:
        """Cache a block mask; the oldest goes beyond BLOCK_MASKS_KEPT (lengths seen come and go:
        each mask holds (tiles x tiles) index tensors)."""
        while len(self._block_masks) >= BLOCK_MASKS_KEPT:
            self._block_masks.pop(next(iter(self._block_masks)))
        self._block_masks[key] = block_mask

    @property
    def dropout_p(self) -> float:
        """Attention-probability dropout to apply now: the `dropout` option in training, else 0.

        Masks come from the global RNG, so a reversible or checkpointed recomputation that
        replays the RNG state (see rng.py) draws the same masks."""
        return float(getattr(self.cfg, "dropout", 0.0)) if self.training else 0.0

    def extra_repr(self) -> str:
        return f"causal={self.causal}, {self.cfg}"

    # ---- decoding, run by decode.py: a causal core with a state of its own sets init_state and
    # defines state_bytes and step; with init_state None, decoding recomputes the forward over the
    # prefix every step ----------------------------------------------------------------------------

    init_state: ClassVar[Callable[[StateShape], DecodeState] | None] = None  # an empty state

    @staticmethod
    def decoding(cfg: Any) -> str:
        """How a core with a state of its own decodes with options cfg (state.DECODINGS)."""
        return CACHED

    def state_bytes(self, shape: StateShape) -> int:
        """The bytes of the state init_state makes for `shape`, by formula (no tensor made)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no decoding state of its own")

    def step(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        state: DecodeState,
        key_padding_mask: Tensor | None,
        **extras: Tensor,
    ) -> tuple[Tensor, DecodeState]:
        """The outputs of t new tokens (b, h, t, d_v) against `state`, and the state after them
        (decode.step has checked the inputs)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no decoding state of its own")


BLOCK_MASKS_KEPT = 8  # per core: a few lengths and devices

OWN = Implementation(
    name="attend",
    summary="the core's own attend",
    run=lambda core, q, k, v, mask, **extras: core.attend(q, k, v, mask, **extras),
    dropout=True,
    grouped=True,
)

# The table of a core with its own attend: that, or flex for a fixed pattern (auto on CUDA).
OWN_KERNELS = KernelTable((OWN, FLEX), {"cuda": ("flex", "attend"), "cpu": ("attend",)})
# The fixed patterns' order of preference: the fused CPU op, FlexAttention on CUDA, else math.
PATTERN_PRIORITY = {
    "cpu": ("cpu-fused", "math"),
    "cuda": ("flex", "math"),
}
AttentionCore.kernels = OWN_KERNELS


def pattern_kernels(
    run: Callable[..., Tensor], fused: str, math: str, checks: tuple[Check, ...] = ()
) -> KernelTable:
    """A fixed pattern's kernels: `run(core, *args, fused=...)` through PyTorch's fused CPU op
    (summary `fused`) or materialised with grouped heads (`math`), and FlexAttention on CUDA."""
    return KernelTable(
        (
            cpu_fused(lambda core, *args: run(core, *args, fused=True), fused, checks),
            materialised(lambda core, *args: run(core, *args, fused=False), math, grouped=True),
            FLEX,
        ),
        PATTERN_PRIORITY,
    )
