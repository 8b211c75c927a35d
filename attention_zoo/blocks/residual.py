"""Residual variants over a stack of (f, g) layers: standard, checkpointed, reversible (RevNet).

standard:   x = x + f(x); x = x + g(x)                 autograd keeps every layer's activations
checkpoint: the same, each layer under torch.utils.checkpoint: keeps only each layer's input
reversible: Y1 = X1 + f(X2), Y2 = X2 + g(Y1) (Gomez et al. 2017; Kitaev et al. 2020, section 3).
            Backward recovers X2 = Y2 - g(Y1), X1 = Y1 - f(X2) from the outputs, so no per-layer
            activation is kept.
Every variant returns two streams concatenated, (b, n, 2 * hidden), as HF's reversible Reformer
does: reversible gives Y1 and Y2; standard and checkpoint have one stream and give it twice, so
the layers above (LayerNorm over 2 * hidden, the LM head) have one shape for all three.

Every variant owns its layers under the same names (`layers.i.f`, `layers.i.g`), so a state dict
moves between variants unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..attention.kernels.autocast import autocasting
from ..attention.kernels.backward import refuse_second_order
from ..registry import Registry
from ..rng import RNGState, record_rng, replay_rng
from .layer import ReformerLayer


def standard_layer(layer: ReformerLayer, x: Tensor, key_padding_mask: Tensor | None) -> Tensor:
    """x + f(x), then + g: one pre-norm transformer layer, (b, n, hidden) -> (b, n, hidden)."""
    x = x + layer.f(x, key_padding_mask)
    return x + layer.g(x)


class StandardResidual(nn.Module):
    """Plain residual stack; autograd stores the activations of every layer."""

    def __init__(self, layers: Iterable[ReformerLayer]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """(b, n, hidden) -> (b, n, 2 * hidden): the one stream, twice."""
        for layer in self.layers:
            x = standard_layer(layer, x, key_padding_mask)
        return torch.cat([x, x], dim=-1)


class CheckpointResidual(StandardResidual):
    """Standard residual with each layer recomputed in backward (torch.utils.checkpoint).

    checkpoint restores the RNG state for the recomputation, so dropout and LSH rotations replay.
    """

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """(b, n, hidden) -> (b, n, 2 * hidden): the one stream, twice."""
        if not torch.is_grad_enabled():
            return super().forward(x, key_padding_mask)
        for layer in self.layers:
            x = checkpoint(partial(standard_layer, layer), x, key_padding_mask, use_reentrant=False)
        return torch.cat([x, x], dim=-1)


class ReversibleResidual(StandardResidual):
    """Two-stream RevNet stack whose backward recomputes inputs from outputs.

    recompute=False runs the very same two-stream network under plain autograd (activations kept):
    the exact reference the reversible gradients are tested against, and a memory baseline.
    """

    def __init__(self, layers: Iterable[ReformerLayer], *, recompute: bool = True) -> None:
        super().__init__(layers)
        self.recompute = recompute

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """(b, n, hidden) -> (b, n, 2 * hidden): the two output streams, [Y1, Y2]."""
        if self.recompute and torch.is_grad_enabled():
            params = [p for p in self.parameters() if p.requires_grad]
            y1, y2 = _ReversibleFunction.apply(x, x, self.layers, key_padding_mask, params, *params)
        else:
            y1, y2 = x, x
            for layer in self.layers:
                y1 = y1 + layer.f(y2, key_padding_mask)
                y2 = y2 + layer.g(y1)
        return torch.cat([y1, y2], dim=-1)

    def extra_repr(self) -> str:
        return f"recompute={self.recompute}"


def _autocast_state(device_type: str) -> tuple[str, torch.dtype] | None:
    """The autocast (device type, dtype) active now, or None."""
    if autocasting(device_type):
        return device_type, torch.get_autocast_dtype(device_type)
    return None


def _autocast(state: tuple[str, torch.dtype] | None) -> AbstractContextManager:
    """Backward runs outside the caller's autocast region: re-enter the forward's state."""
    return nullcontext() if state is None else torch.autocast(state[0], dtype=state[1])


def _trainable(module: nn.Module) -> list[nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


class _ReversibleFunction(torch.autograd.Function):
    """All layers in one autograd node: saves only the final two streams and the RNG states."""

    @staticmethod
    def forward(
        ctx: Any,
        x1: Tensor,
        x2: Tensor,
        layers: nn.ModuleList,
        key_padding_mask: Tensor | None,
        params: list[nn.Parameter],
        *flat_params: Tensor,
    ) -> tuple[Tensor, Tensor]:
        rng: list[tuple[RNGState, RNGState]] = []
        for layer in layers:  # autograd is off inside Function.forward: nothing is stored
            state_f = record_rng(x2.device)
            x1 = x1 + layer.f(x2, key_padding_mask)
            state_g = record_rng(x1.device)
            x2 = x2 + layer.g(x1)
            rng.append((state_f, state_g))
        ctx.layers, ctx.rng = layers, rng
        ctx.autocast = _autocast_state(x1.device.type)
        ctx.param_index = {id(p): i for i, p in enumerate(params)}
        ctx.save_for_backward(x1, x2, key_padding_mask)
        return x1, x2

    @staticmethod
    def backward(ctx: Any, dy1: Tensor, dy2: Tensor) -> tuple[Tensor | None, ...]:
        refuse_second_order("the reversible residual", "residual='standard'")
        y1, y2, key_padding_mask = ctx.saved_tensors
        grads: list[Tensor | None] = [None] * len(ctx.param_index)

        def collect(params: list[nn.Parameter], found: tuple[Tensor | None, ...]) -> None:
            for p, d in zip(params, found):
                i = ctx.param_index[id(p)]
                if d is not None:
                    grads[i] = d if grads[i] is None else grads[i] + d

        for layer, (state_f, state_g) in zip(reversed(ctx.layers), reversed(ctx.rng)):
            # Y2 = X2 + g(Y1): recompute g(Y1) with the forward's RNG, recover X2, backprop g.
            g_params = _trainable(layer.g)
            with torch.enable_grad(), replay_rng(state_g), _autocast(ctx.autocast):
                y1 = y1.detach().requires_grad_(True)
                g_out = layer.g(y1)
            dy1_from_g, *d_g = torch.autograd.grad(g_out, (y1, *g_params), dy2, allow_unused=True)
            collect(g_params, tuple(d_g))
            x2 = y2 - g_out.detach()
            dy1 = dy1 + dy1_from_g  # dL/dY1 in total, which is also dL/dX1
            del g_out, dy1_from_g, d_g

            # Y1 = X1 + f(X2): recompute f(X2), recover X1, backprop f.
            f_params = _trainable(layer.f)
            with torch.enable_grad(), replay_rng(state_f), _autocast(ctx.autocast):
                x2 = x2.detach().requires_grad_(True)
                f_out = layer.f(x2, key_padding_mask)
            dx2_from_f, *d_f = torch.autograd.grad(f_out, (x2, *f_params), dy1, allow_unused=True)
            collect(f_params, tuple(d_f))
            y1 = y1.detach() - f_out.detach()  # X1
            y2 = x2.detach()
            dy2 = dy2 + dx2_from_f  # dL/dX2 = dL/dY2 + f'(X2)^T dL/dY1
            del f_out, dx2_from_f, d_f

        return (dy1, dy2, None, None, None, *grads)


RESIDUALS: Registry[type[StandardResidual]] = Registry("residual")
RESIDUALS.add("standard", StandardResidual)
RESIDUALS.add("reversible", ReversibleResidual)
RESIDUALS.add("checkpoint", CheckpointResidual)
