"""Operators on meta tensors run once per distinct input: a prediction's repeats reuse the result.

torch runs many meta kernels as Python references, slowly for each operator, while a step
repeats the same operator on the same shapes (every segment, layer and step). On meta, an
operator that returns fresh tensors is a function of its inputs' metadata, its other arguments and
the default dtype, so the outputs' shapes, strides, dtypes and storage sizes are kept per input
and made anew.
"""

from __future__ import annotations

from typing import Any

import torch

from .modes import UncompiledMode
from .tracker import tensors_in

# shape, strides, dtype, storage offset, storage bytes
_Layout = tuple[torch.Size, tuple[int, ...], torch.dtype, int, int]


FRESH = "fresh"  # a kept operator returns new tensors
IN_PLACE = "in place"  # a kept operator returns its first input, written in place
_NOT_KEPT = object()  # a key seen for the first time


def memo_kind(func: torch._ops.OpOverload) -> str | None:
    """FRESH where `func`'s schema returns only new Tensors (no view, no aliased argument); IN_PLACE
    where it writes its first argument only, keeps its shape (no resize or in-place view) and
    returns it; else None, random operators included."""
    schema = func._schema
    if func.is_view or len(schema.returns) == 0 or torch.Tag.nondeterministic_seeded in func.tags:
        return None
    aliased = [a for a in (*schema.arguments, *schema.returns) if a.alias_info is not None]
    if not aliased:
        return FRESH if all(str(r.type) == "Tensor" for r in schema.returns) else None
    first = schema.arguments[0].alias_info if schema.arguments else None
    in_place = torch.Tag.inplace in func.tags and torch.Tag.inplace_view not in func.tags
    writes_first = first is not None and first.is_write and len(aliased) == 2
    returns_it = len(schema.returns) == 1 and str(schema.returns[0].type) == "Tensor"
    return IN_PLACE if in_place and writes_first and returns_it else None


class MetaMemo(UncompiledMode):
    """While active, an operator of a memo_kind on meta tensors runs once per distinct key (_key);
    a repeat gets new tensors of the kept layouts, or its first input back; anything else runs.
    Enter it before the modes that count, which then see its outputs."""

    def __init__(self) -> None:
        super().__init__()
        self._kinds: dict[Any, str | None] = {}
        self._kept: dict[tuple, tuple[bool, list[_Layout]] | None] = {}
        self.repeats = 0  # operators answered from what was kept, not run

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (kind := self._kinds.get(func, "")) == "":
            kind = self._kinds[func] = memo_kind(func)
        key = _key(func, args, kwargs) if kind is not None else None
        try:
            kept = _NOT_KEPT if key is None else self._kept.get(key, _NOT_KEPT)
        except TypeError:  # an argument that cannot be part of a key
            key = None
        if key is None:
            return func(*args, **kwargs)
        if kept is not _NOT_KEPT:
            self.repeats += 1
            if kept is None:
                return args[0]  # IN_PLACE: its metadata as the first run left it
            single, layouts = kept
            made = [_made(layout) for layout in layouts]
            return made[0] if single else tuple(made)
        before = _layout(args[0]) if kind == IN_PLACE else None
        out = func(*args, **kwargs)
        outputs = [out] if isinstance(out, torch.Tensor) else list(out)
        if not all(_plain_meta(t) for t in outputs):
            return out  # e.g. a CPU tensor made from no input (torch.arange(n)): it holds values
        if kind == IN_PLACE:
            ok = out is args[0] and _layout(out) == before
            layouts = None
        else:
            layouts = _layouts(outputs, args, kwargs)
            ok = layouts is not None
        if not ok:
            self._kinds[func] = None  # it did not do what its schema says: never kept
        else:
            self._kept[key] = None if kind == IN_PLACE else (isinstance(out, torch.Tensor), layouts)
        return out


def _key(func: Any, args: tuple, kwargs: dict) -> tuple | None:
    """What an operator's result depends on when its tensors are on meta (a factory without a
    dtype takes the default one); None where a tensor is not a plain meta tensor (_plain_meta)."""
    parts: list[Any] = [func, torch.get_default_dtype()]
    if not _add_parts(args, parts):
        return None
    for name, value in kwargs.items():
        parts.append(name)
        if not _add_parts(value, parts):
            return None
    return tuple(parts)


def _add_parts(x: Any, parts: list[Any]) -> bool:
    """Append `x`'s part of a key (a tensor's metadata, a list's length then its items, any
    other value with its type: 1, 1.0 and True are equal keys but different arguments)."""
    if isinstance(x, torch.Tensor):
        if not _plain_meta(x):
            return False
        parts.append((x.shape, x.stride(), x.dtype, x.storage_offset(), x.is_conj(), x.is_neg()))
        return True
    if isinstance(x, (list, tuple)):
        parts.append((type(x), len(x)))
        return all(_add_parts(item, parts) for item in x)
    parts.append((type(x), x))
    return True


def _plain_meta(t: Any) -> bool:
    """A strided meta tensor (a Parameter too) without a subclass's behaviour or a zero tensor's
    flag, which a tensor made from its layout would lose."""
    plain = type(t) is torch.Tensor or type(t) is torch.nn.Parameter
    return plain and t.is_meta and t.layout == torch.strided and not t._is_zerotensor()


def _layouts(outputs: list[torch.Tensor], args: tuple, kwargs: dict) -> list[_Layout] | None:
    """Each output's layout and storage bytes; None where an output shares storage with an input
    or another output (not fresh)."""
    seen = {x.untyped_storage()._cdata for x in tensors_in(args, kwargs)}
    layouts = []
    for t in outputs:
        storage = t.untyped_storage()
        if storage._cdata in seen:
            return None
        if storage.nbytes() % t.element_size():
            return None
        seen.add(storage._cdata)
        layouts.append(_layout(t))
    return layouts


def _layout(t: torch.Tensor) -> _Layout:
    return t.shape, t.stride(), t.dtype, t.storage_offset(), t.untyped_storage().nbytes()


def _made(layout: _Layout) -> torch.Tensor:
    """A new meta tensor with `layout`, on a storage of its bytes."""
    shape, stride, dtype, offset, nbytes = layout
    flat = torch.empty(nbytes // dtype.itemsize, dtype=dtype, device="meta")
    return flat.as_strided(shape, stride, offset)
