"""FLOPs counted with torch.utils.flop_counter's formulas: deterministic, device independent.

The counter only knows ops with a registered formula (matmuls, convolutions, fused attention); we
add the CPU flash-attention ops PyTorch leaves out, so SDPA on CPU is not counted as zero, the
triangular solve (the delta rule's chunked form) and the in-place baddbmm_ it has no formula for.
Element-wise work (softmax, masking, sorting) is not counted, and causal fused attention is
counted as the full product, as PyTorch does: FLOPs compare the matmul work of mechanisms, not
total time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import flop_counter

from .modes import UncompiledMode

aten = torch.ops.aten


def _register_cpu_flash() -> None:
    forward = aten._scaled_dot_product_flash_attention_for_cpu
    backward = aten._scaled_dot_product_flash_attention_for_cpu_backward
    if forward not in flop_counter.flop_registry:

        @flop_counter.register_flop_formula(forward)
        def _forward(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
            return flop_counter.sdpa_flop_count(q_shape, k_shape, v_shape)

    if backward not in flop_counter.flop_registry:

        @flop_counter.register_flop_formula(backward)
        def _backward(g_shape, q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
            return flop_counter.sdpa_backward_flop_count(g_shape, q_shape, k_shape, v_shape)


_register_cpu_flash()


def _register_triangular_solve() -> None:
    solve = aten.linalg_solve_triangular
    if solve not in flop_counter.flop_registry:

        @flop_counter.register_flop_formula(solve)
        def _solve(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
            # substitution: m^2 / 2 multiply-adds per right-hand side, half an (m x m) @ (m x r)
            # matmul, which torch counts as 2 m^2 r; out_shape is (..., m, r) or (..., r, m)
            return math.prod(out_shape) * a_shape[-1]


_register_triangular_solve()


def _register_in_place_products() -> None:
    """baddbmm_ (accumulating into a buffer, as tiled kernels do): baddbmm's formula, which
    PyTorch registers for the out-of-place op only."""
    if aten.baddbmm_ not in flop_counter.flop_registry:

        @flop_counter.register_flop_formula(aten.baddbmm_)
        def _baddbmm_(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
            batches, m, k = a_shape
            return 2 * batches * m * k * b_shape[-1]


_register_in_place_products()


_SHAPE_QUERIES = {
    aten.is_contiguous.default,
    aten.is_contiguous.memory_format,
    aten.is_strides_like_format.default,
    aten.is_non_overlapping_and_dense.default,
    aten.size.default,
    aten.sym_size.default,
    aten.stride.default,
    aten.sym_stride.default,
    aten.storage_offset.default,
    aten.sym_storage_offset.default,
    aten.numel.default,
    aten.sym_numel.default,
    aten.dim.default,
    torch.ops.prim.layout.default,
}


class FlopCounter(UncompiledMode):
    """FLOPs from PyTorch's flop_registry formulas, as FlopCounterMode counts them.

    FlopCounterMode also tracks modules with autograd hooks, which breaks custom autograd
    functions that call torch.autograd.grad in backward (reversible layers); this mode only counts.
    """

    def __init__(self) -> None:
        super().__init__()
        self.total = 0
        # operators not decomposed (none to decompose into): counted as they are
        self._whole: set[Any] = {torch.ops.prim.device.default}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _SHAPE_QUERIES:
            return NotImplemented
        formula = flop_counter.flop_registry.get(func._overloadpacket)
        if formula is None and func not in self._whole:
            with self:  # composite ops: count the ops they decompose into
                out = func.decompose(*args, **kwargs)
                if out is not NotImplemented:
                    return out
            self._whole.add(func)
        out = func(*args, **kwargs)
        if formula is not None:
            self.total += int(formula(*args, **kwargs, out_val=out))
        return out


def count_flops(fn: Callable[[], Any]) -> tuple[Any, int]:
    """Run fn() under a FlopCounter; its result and the total FLOPs (multiply-add = 2)."""
    with FlopCounter() as counter:
        result = fn()
    return result, counter.total
