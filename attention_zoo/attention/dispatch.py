"""Which implementation of a mechanism runs: one rule for every backend.

Each implementation states where it runs (devices, dtypes, torch version or package, attention
dropout, head size, the options it computes) and, when it cannot, why, as xformers' fmha dispatch
does. `kernel="auto"` takes the first implementation of the device's priority list (its list for
the dtype, where it keeps one) that can run and pays for the call (an implementation may say it
does not, where a later one is cheaper: dense products on short inputs); a named kernel runs, or
refuses in one line with its reasons. The name of the one that ran is what
measurements store. On the meta device (shapes only: predictions) auto picks as on the CPU, which
meta stands in for, unless a table keeps a list for meta itself.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake
from torch.utils._triton import has_triton

from ..errors import OptionError, UnavailableError

AUTO = "auto"
FLOAT_DTYPES = frozenset({torch.float32, torch.float64, torch.bfloat16, torch.float16})


@dataclass(frozen=True)
class Call:
    """What one call needs, known before anything runs."""

    device: str  # cpu, cuda, meta
    dtype: torch.dtype
    length: int
    head_dim: int
    dropout: bool = False  # attention dropout applies (training, p > 0)
    fake: bool = False  # FakeTensors or the meta device: shapes only, nothing launched
    masked: bool = False  # a key padding mask comes with it
    group: int = 1  # query heads per key/value head (> 1: shared KV heads, GQA / MQA)

    @classmethod
    def of(
        cls,
        x: Tensor,
        head_dim: int,
        dropout: float = 0.0,
        masked: bool = False,
        group: int = 1,
    ) -> Call:
        """The call on x (..., n, *) with heads of head_dim: its device, dtype and length. Traced
        by torch.compile, its tensors are fake only while tracing: the compiled call is real."""
        fake = x.device.type == "meta" or (not torch.compiler.is_compiling() and is_fake(x))
        length = x.shape[-2]
        return cls(x.device.type, x.dtype, length, head_dim, bool(dropout), fake, masked, group)


# (core, call) -> why this implementation cannot compute it, or None
Check = Callable[[Any, Call], "str | None"]
# (core, call) -> whether auto should run it where it can (False: a later one that can is cheaper)
Pays = Callable[[Any, Call], bool]
# (core, q, k, v, key_padding_mask, **extras) -> out; extras: the core's declared extra inputs
Run = Callable[..., Tensor]


@dataclass(frozen=True, kw_only=True)
class Implementation:
    """One way to compute a mechanism, and where it can run."""

    name: str
    summary: str  # what it computes with, in a few words
    run: Run
    devices: frozenset[str] = frozenset({"cpu", "cuda", "meta"})
    dtypes: frozenset[torch.dtype] = FLOAT_DTYPES
    dropout: bool = False  # can apply attention dropout
    grouped: bool = False  # takes fewer key/value heads than query heads (kv_heads)
    fake: bool = True  # traces on FakeTensors / meta (memory predictions)
    # the installation: a missing package or a torch without the feature (cached per device)
    environment: Callable[[str], str | None] | None = None
    checks: tuple[Check, ...] = ()  # the options and shapes it computes
    pays: Pays | None = None  # auto passes it over for a later one that can run where False

    def reasons(self, core: Any, call: Call) -> list[str]:
        """Why it cannot compute `call` for `core`; empty when it can."""
        found = []
        if call.device not in self.devices:
            found.append(f"runs on {', '.join(sorted(self.devices))}, not {call.device}")
        if call.dtype not in self.dtypes:
            names = ", ".join(sorted(_dtype_name(t) for t in self.dtypes))
            found.append(f"takes {names}, not {_dtype_name(call.dtype)}")
        if call.dropout and not self.dropout:
            found.append("applies no attention dropout (the core has dropout > 0 in training)")
        if call.group > 1 and not self.grouped:
            found.append("takes no shared KV heads (kv_heads fewer than the query heads)")
        if call.fake and not self.fake:
            found.append("does not trace on FakeTensors or the meta device")
        # the installation is checked eagerly; a caller inside torch.compile has a compiler
        if self.environment is not None and not found and not torch.compiler.is_compiling():
            if reason := self.environment(call.device):
                found.append(reason)
        found += [r for check in self.checks if (r := check(core, call))]
        return found


@dataclass(frozen=True)
class KernelTable:
    """A backend's implementations and, per device, their order of preference."""

    implementations: tuple[Implementation, ...]
    # device -> names, best first; "device:dtype" (cpu:bfloat16) for one dtype there, where the
    # best differs by dtype; meta takes the CPU's lists unless it has its own
    priority: Mapping[str, tuple[str, ...]]
    # instead of the priority lists: a library's own dispatch names the one auto runs (SDPA)
    choose: Callable[[Any, Call], str] | None = None
    # the one computing the mechanism's own products in a few large ops, where the table has it
    # (fair-comparison FLOPs count it): plain PyTorch, unless that is a dense reference
    plain: str = "math"
    by_name: dict[str, Implementation] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_name", {i.name: i for i in self.implementations})
        unknown = {n for names in self.priority.values() for n in names} - set(self.by_name)
        if self.plain != "math":  # a table without math has no plain one, unless it names it
            unknown |= {self.plain} - set(self.by_name)
        if unknown or len(self.by_name) != len(self.implementations):
            raise ValueError(f"kernel table: unknown or repeated names {sorted(unknown)}")
        dtypes = {_dtype_name(t) for t in FLOAT_DTYPES}
        if bad := [k for k in self.priority if k.partition(":")[2] not in ("", *dtypes)]:
            raise ValueError(f"kernel table: {bad} name no dtype of {sorted(dtypes)}")
        if bad := [k for k in self.priority if not _is_device_type(k.partition(":")[0])]:
            raise ValueError(f"kernel table: {bad} name no torch device type (cpu, cuda, ...)")

    @property
    def names(self) -> tuple[str, ...]:
        """What the `kernel` option accepts."""
        return (AUTO, *self.by_name)

    def check_option(self, backend: str, kernel: object) -> None:
        """Raise OptionError unless `kernel` names one of these implementations or auto."""
        if kernel not in self.names:
            raise OptionError(f"{backend} kernel {kernel!r} is not one of: {', '.join(self.names)}")

    def pick(self, backend: str, kernel: str, core: Any, call: Call) -> Implementation:
        """The implementation that runs `call`: the named one, or with auto the first of the
        device's priority list that can and pays (the first that can where none pays). Raises
        UnavailableError (one line, every reason)."""
        if kernel != AUTO:
            impl = self.by_name[kernel]
            if reasons := impl.reasons(core, call):
                raise UnavailableError(
                    f"{backend} kernel={kernel!r} cannot run here: {'; '.join(reasons)}; "
                    f"use kernel='auto' (picks {self._auto_name(core, call)})"
                )
            return impl
        if self.choose is not None:
            return self.by_name[self.choose(core, call)]
        why, runnable = [], []
        for name in self.preference(call):
            impl = self.by_name[name]
            if reasons := impl.reasons(core, call):
                why.append(f"{name}: {'; '.join(reasons)}")
            elif impl.pays is None or impl.pays(core, call):
                return impl
            else:
                runnable.append(impl)
        if runnable:  # none pays: the first that can run
            return runnable[0]
        raise UnavailableError(
            f"{backend}: no implementation runs on {call.device} {_dtype_name(call.dtype)}"
            + (f" ({' | '.join(why)})" if why else "")
        )

    def preference(self, call: Call) -> tuple[str, ...]:
        """The names auto tries for `call`, best first: its device's list for its dtype where the
        table has one, else the device's; on meta without lists of its own, the CPU's."""
        device = call.device
        if device == "meta" and not any(k.partition(":")[0] == "meta" for k in self.priority):
            device = "cpu"
        by_dtype = self.priority.get(f"{device}:{_dtype_name(call.dtype)}")
        return by_dtype if by_dtype is not None else self.priority.get(device, ())

    def replacing(self, name: str, **changes: Any) -> KernelTable:
        """This table with implementation `name` changed (a backend that composes a family's
        kernels its own way), in the same order of preference."""
        implementations = tuple(
            replace(i, **changes) if i.name == name else i for i in self.implementations
        )
        return replace(self, implementations=implementations)

    def _auto_name(self, core: Any, call: Call) -> str:
        try:
            return self.pick("", AUTO, core, call).name
        except UnavailableError:
            return "none: nothing runs here"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _is_device_type(name: str) -> bool:
    """Whether `name` is a device type as `Call.device` holds it (cpu, cuda, meta; no index)."""
    try:
        return torch.device(name).type == name
    except RuntimeError:
        return False


@functools.cache
def package_reason(module: str, pip_name: str) -> str | None:
    """Why an optional package cannot be imported here (found without importing it), or None."""
    if importlib.util.find_spec(module) is None:
        return f"needs the {pip_name} package (pip install {pip_name})"
    return None


@functools.cache
def compile_reason(device: str) -> str | None:
    """Why torch.compile cannot generate kernels for `device` here, or None."""
    if device == "cuda" and not has_triton():
        return "torch.compile needs Triton for CUDA kernels, and it is not usable here"
    return None


# PyTorch's fused CPU attention ops (forward and backward); a constant of the installed torch
_CPU_OPS_EXIST = hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu") and hasattr(
    torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward"
)


def _cpu_ops_reason(device: str) -> str | None:
    if not _CPU_OPS_EXIST:
        return f"needs PyTorch's fused CPU attention op, which torch {torch.__version__} lacks"
    return None


def cpu_fused(
    run: Run, summary: str, checks: tuple[Check, ...] = (), *, grouped: bool = False
) -> Implementation:
    """An implementation on PyTorch's fused CPU attention op (`_scaled_dot_product_flash_attention
    _for_cpu` and its backward): CPU, traced on meta, no attention dropout. `grouped`: it takes
    fewer key/value heads than query heads (the op does)."""
    return Implementation(
        name="cpu-fused",
        summary=summary,
        run=run,
        devices=frozenset({"cpu", "meta"}),
        environment=_cpu_ops_reason,
        checks=checks,
        grouped=grouped,
    )


def materialised(
    run: Run, summary: str, checks: tuple[Check, ...] = (), *, grouped: bool = False
) -> Implementation:
    """An implementation in plain PyTorch with autograd ("math"): any device and dtype, attention
    dropout, traced on FakeTensors; the path everything else falls back to. `grouped`: it takes
    shared KV heads, repeated to the query heads before `run`."""
    return Implementation(
        name="math",
        summary=summary,
        run=repeating_kv(run) if grouped else run,
        dropout=True,
        checks=checks,
        grouped=grouped,
    )


def expand_kv(q: Tensor, t: Tensor) -> Tensor:
    """k or v (b, kv, n, d) repeated to q's head count (b, h, n, d): each group of h / kv query
    heads reads its shared head. For code with no grouped-head support of its own."""
    group = q.shape[1] // t.shape[1]
    return t if group == 1 else t.repeat_interleave(group, dim=1)


def repeating_kv(run: Run) -> Run:
    """`run` on shared KV heads: k and v repeated to the query heads first."""

    def grouped(core: Any, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, **extras: Any):
        return run(core, q, expand_kv(q, k), expand_kv(q, v), mask, **extras)

    return grouped
