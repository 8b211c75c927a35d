"""A backend's input streams, declared once: q, k, v with their head counts and widths, and any
extra per-token, per-head inputs (decays, step sizes, gates). The block projects them from the
hidden states; the bench, the conformance suite, decoding, FLOP counts and memory predictions
sample them from the same declaration."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..errors import ConfigError, OptionError, ShapeError
from .dispatch import expand_kv as expand_kv  # re-exported: part of the contract

Squash = Callable[[Tensor], Tensor]


def unit_sigmoid(x: Tensor) -> Tensor:
    """A step size in (0, 1)."""
    return torch.sigmoid(x)


def double_sigmoid(x: Tensor) -> Tensor:
    """A step size in (0, 2): the delta rule's negative eigenvalues (Grazzi et al.)."""
    return 2 * torch.sigmoid(x)


def gaussian(
    shape: tuple[int, ...],
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
) -> Tensor:
    """Standard normal values; on the meta device only the shape (a meta randn runs PyTorch's
    Python reference checks, whose first call imports sympy: a second spent on nothing)."""
    if torch.device(device).type == "meta":
        return torch.empty(shape, dtype=dtype, device=device)
    return torch.randn(shape, dtype=dtype, device=device, generator=generator)


@dataclass(frozen=True)
class Extra:
    """A per-token, per-head input besides q, k, v: a linear map of the hidden states through
    `squash`, which puts any value in the range the mechanism is stable in (the bench squashes
    Gaussian samples the same way, so sampled inputs are as stable as projected ones)."""

    name: str
    squash: Squash
    per_key_channel: bool = False  # (b, h, n, key width) instead of (b, h, n)

    def width(self, key_width: int) -> int:
        """Projected features per head."""
        return key_width if self.per_key_channel else 1


@dataclass(frozen=True)
class InputLayout:
    """What a core takes: q (b, h, n, dk), k (b, kv, n, dk), v (b, kv, n, dk * expand_v) and
    each extra; kv = kv_heads (fewer key/value heads shared by groups of query heads) or h.
    Under shared QK the block feeds the query tensor as k."""

    shared_qk: bool = False
    kv_heads: int | None = None  # None: one key/value head per query head
    expand_v: int = 1  # value width over key width
    extras: tuple[Extra, ...] = ()

    def kv_heads_for(self, heads: int) -> int:
        """Key/value heads beside `heads` query heads; raises ConfigError unless they divide."""
        kv = heads if self.kv_heads is None else self.kv_heads
        if heads % kv:
            raise ConfigError(
                f"kv_heads={kv} must divide the {heads} query heads; "
                f"pick among {', '.join(str(d) for d in range(1, heads + 1) if heads % d == 0)}"
            )
        return kv

    @property
    def plain(self) -> bool:
        """q, k, v of one shape and nothing else: what the folded block products assume."""
        simple = not self.shared_qk and self.kv_heads is None and self.expand_v == 1
        return simple and len(self.extras) == 0  # len: traceable by torch.compile

    def projections(self, heads: int, head_dim: int) -> dict[str, int]:
        """Output features of each input projection, in the order the block's fused map holds
        them (shared QK: no k)."""
        kv = self.kv_heads_for(heads)
        sizes = {"q": heads * head_dim}
        if not self.shared_qk:
            sizes["k"] = kv * head_dim
        sizes["v"] = kv * head_dim * self.expand_v
        for extra in self.extras:
            sizes[extra.name] = heads * extra.width(head_dim)
        return sizes

    def sample(
        self,
        batch: int,
        heads: int,
        length: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        requires_grad: bool = False,
        generator: torch.Generator | None = None,
    ) -> Inputs:
        """Random inputs of this layout: Gaussian q, k, v; each extra a squashed Gaussian (a leaf
        in its stable range)."""

        def draw(*shape: int) -> Tensor:
            t = gaussian(shape, dtype=dtype, device=device, generator=generator)
            return t.requires_grad_(requires_grad)

        kv = self.kv_heads_for(heads)
        q = draw(batch, heads, length, head_dim)
        k = q if self.shared_qk else draw(batch, kv, length, head_dim)
        v = draw(batch, kv, length, head_dim * self.expand_v)
        extras = self.sample_extras(q, requires_grad=requires_grad, generator=generator)
        return Inputs(q, k, v, extras)

    def sample_extras(
        self, q: Tensor, *, requires_grad: bool = False, generator: torch.Generator | None = None
    ) -> dict[str, Tensor]:
        """Random extras beside queries q (b, h, n, d), of q's dtype and device, each a squashed
        Gaussian leaf: for a caller that draws q, k, v its own way (the fidelity measure)."""
        extras = {}
        for extra in self.extras:
            shape = (*q.shape[:-1], extra.width(q.shape[-1]))
            raw = gaussian(shape, dtype=q.dtype, device=q.device, generator=generator)
            value = extra.squash(raw if extra.per_key_channel else raw.squeeze(-1))
            extras[extra.name] = value.requires_grad_(requires_grad)
        return extras

    def check(self, q: Tensor, k: Tensor, v: Tensor, extras: dict[str, Tensor]) -> None:
        """Raise ShapeError unless the tensors have this layout's heads, widths and extras."""
        b, h, n, d = q.shape
        kv = self.kv_heads_for(h)
        want = {"k": (b, kv, n, d), "v": (b, kv, n, d * self.expand_v)}
        for label, t in (("k", k), ("v", v)):
            if tuple(t.shape) != want[label]:
                raise ShapeError(
                    f"{label} must be {want[label]} beside q {tuple(q.shape)} "
                    f"(kv_heads={kv}, expand_v={self.expand_v}), got {tuple(t.shape)}"
                )
        names = [e.name for e in self.extras]
        if sorted(extras) != sorted(names):
            raise ShapeError(
                f"this core takes the extra inputs [{', '.join(names)}], "
                f"got [{', '.join(sorted(extras))}]"
            )
        for extra in self.extras:
            t = extras[extra.name]
            shape = (b, h, n, d) if extra.per_key_channel else (b, h, n)
            if not isinstance(t, Tensor) or tuple(t.shape) != shape:
                got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
                raise ShapeError(f"{extra.name} must be {shape}, got {got}")


@dataclass(frozen=True)
class Inputs:
    """One call's inputs: q, k, v and the extras by name."""

    q: Tensor
    k: Tensor
    v: Tensor
    extras: dict[str, Tensor]

    def leaves(self) -> tuple[Tensor, ...]:
        """Each distinct tensor once (shared QK: q is k)."""
        return tuple({id(t): t for t in (self.q, self.k, self.v, *self.extras.values())}.values())

    def window(self, start: int, stop: int) -> Inputs:
        """Positions start..stop-1 of every stream (new tokens of a decoding step)."""
        cut = {name: t[:, :, start:stop] for name, t in self.extras.items()}
        q, k, v = (t[:, :, start:stop] for t in (self.q, self.k, self.v))
        return Inputs(q, k, v, cut)

    def at(self, position: Tensor) -> Inputs:
        """The one position a 0-d long tensor names, of every stream: a captured decoding step
        reads its token where the device says (shared QK: q is still k)."""
        index = position.view(1)
        picked = {id(t): t.index_select(2, index) for t in self.leaves()}
        extras = {name: picked[id(t)] for name, t in self.extras.items()}
        return Inputs(picked[id(self.q)], picked[id(self.k)], picked[id(self.v)], extras)


def default_layout(cfg: Any, shared_qk: bool) -> InputLayout:
    """The layout of a core that declares none of its own: q, k, v (k = q under shared QK), with
    the config's `kv_heads` when it has that option."""
    return InputLayout(shared_qk=shared_qk, kv_heads=getattr(cfg, "kv_heads", None))


def check_kv_heads(backend: str, kv_heads: object) -> None:
    """Raise OptionError unless kv_heads is None (one per query head) or an int >= 1."""
    if kv_heads is None:
        return
    if isinstance(kv_heads, bool) or not isinstance(kv_heads, int) or kv_heads < 1:
        raise OptionError(
            f"{backend} option kv_heads must be an int >= 1 dividing the query heads "
            f"(1: multi-query), or None for one per query head; got {kv_heads!r}"
        )
