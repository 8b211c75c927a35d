"""Backend specs: what a registered attention can do, readable without building it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch._guards import detect_fake_mode

from ..declarative import check_keys, check_types, field_names
from ..errors import OptionError, UnavailableError, ZooError
from ..registry import Registry, origin_of
from .dispatch import Call
from .inputs import InputLayout, default_layout

ALL_DTYPES = frozenset({"float32", "float64", "bfloat16", "float16"})
ALL_DEVICES = frozenset({"cpu", "cuda", "meta"})


@dataclass(frozen=True, kw_only=True)
class Capabilities:
    """Static facts about a backend, so callers can skip a case before building anything.

    What a backend computes is one of four kinds (`kind`): "full" (`exact`: equals full softmax
    attention), "pattern" (`fixed_pattern`: exactly a softmax under a fixed, input-independent
    (n, n) mask that its core returns from `pattern(n)`, e.g. local, sliding-window, bigbird),
    "recurrent" (`recurrent`: a linear recurrence over a constant-size state, judged against its
    own token-by-token form, e.g. retention, gla, deltanet), or "approximate" (none of these:
    lsh's buckets depend on the inputs; kernelised and low-rank ones). Only "full" equals full
    attention: the others differ from it by design.
    """

    causal: bool = True  # can run as a decoder (causal mask)
    exactly_causal: bool = True  # causal outputs never depend on later tokens
    non_causal: bool = True
    shared_qk: bool = False  # the block must feed the same tensor as q and k
    exact: bool = True  # equals full softmax attention (local, lsh, sliding-window: no)
    fixed_pattern: bool = False  # not full, but exact under the core's `pattern(n)` mask
    recurrent: bool = False  # a recurrence, exact against its token-by-token form
    deterministic: bool = True  # same inputs -> same outputs (lsh only when seeded)
    devices: frozenset[str] = ALL_DEVICES
    dtypes: frozenset[str] = ALL_DTYPES

    @property
    def kind(self) -> str:
        """One of "full", "pattern", "recurrent", "approximate" (see the class docstring)."""
        if self.exact:
            return "full"
        if self.fixed_pattern:
            return "pattern"
        return "recurrent" if self.recurrent else "approximate"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["devices"], d["dtypes"] = sorted(self.devices), sorted(self.dtypes)
        d["kind"] = self.kind
        return d


# Capabilities a family shares, declared once (the recurrences' are recurrent.RECURRENT).
PATTERN = Capabilities(exact=False, fixed_pattern=True)  # local, sliding-window, bigbird
ROUTED = Capabilities(exact=False, non_causal=False)  # block selection by content: moba, nsa


@dataclass(frozen=True)
class RunTarget:
    """Where and how a caller wants a backend to run (device, dtype, causal): what
    `BackendSpec.unsupported` is asked about before anything is built."""

    device: str = "cpu"
    dtype: str = "float32"
    causal: bool = False


def always_available(device: str) -> str | None:
    return None


@dataclass(frozen=True, kw_only=True)
class BackendSpec:
    """A registered attention core: its class, option dataclass, capabilities and availability."""

    name: str
    cls: type[nn.Module]
    config: type
    caps: Capabilities
    description: str
    availability: Callable[[str], str | None] = always_available
    # option sets the conformance suite also runs (besides the defaults), e.g. a semantics
    variants: tuple[dict[str, Any], ...] = ()

    def caps_for(self, **options: Any) -> Capabilities:
        """Capabilities with these options: a config may refine them (`capabilities(caps)`)."""
        cfg = self.make_config(**options)
        refine = getattr(cfg, "capabilities", None)
        return refine(self.caps) if refine is not None else self.caps

    def layout(self, **options: Any) -> InputLayout:
        """The inputs the backend takes with these options (see inputs.py), without building it:
        what the block projects and the bench, tests and predictions sample."""
        cfg = self.make_config(**options)
        refine = getattr(cfg, "capabilities", None)
        shared_qk = (refine(self.caps) if refine is not None else self.caps).shared_qk
        declare = getattr(self.cls, "input_layout", None)  # a plugin module may have none
        return declare(cfg, shared_qk) if declare is not None else default_layout(cfg, shared_qk)

    def defaults(self) -> dict[str, Any]:
        """Every option with its default value."""
        out = {}
        for f in dataclasses.fields(self.config):
            if f.default is not dataclasses.MISSING:
                out[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                out[f.name] = f.default_factory()
            else:
                out[f.name] = None
        return out

    def make_config(self, **options: Any) -> Any:
        where = f"backend {self.name!r}"
        if "kv_heads" in options and "kv_heads" not in field_names(self.config):
            raise OptionError(kv_heads_refusal(self))
        check_keys(options, field_names(self.config), where=where, noun="option", error=OptionError)
        cfg = self.config(**options)  # its own checks first: they say what would work
        check_types(self.config, options, where=where, noun="option", error=OptionError)
        return cfg

    def unavailable_reason(self, device: str | torch.device = "cpu") -> str | None:
        """None when the backend can run on `device`, else why not."""
        device = torch.device(device).type
        if reason := self.availability(device):
            return reason
        if device not in self.caps.devices:
            devices = ", ".join(sorted(self.caps.devices))
            return f"{self.name!r} does not run on {device!r} (it runs on: {devices})"
        return None

    def unsupported(self, target: RunTarget) -> str | None:
        """None when the backend can run as `target` asks, else the reason to skip it."""
        if reason := self.unavailable_reason(target.device):
            return reason
        if target.dtype not in self.caps.dtypes:
            dtypes = ", ".join(sorted(self.caps.dtypes))
            return f"{self.name!r} does not support dtype {target.dtype} (supports: {dtypes})"
        if target.causal and not self.caps.causal:
            return f"{self.name!r} cannot run causally (bidirectional only)"
        if not target.causal and not self.caps.non_causal:
            return f"{self.name!r} only runs causally"
        return None

    def describe(self, device: str = "cpu") -> dict[str, Any]:
        """A JSON-friendly summary, as `zoo list --json` prints it."""
        reason = self.unavailable_reason(device)
        return {
            "name": self.name,
            "description": self.description,
            "capabilities": self.caps.to_dict(),
            "options": {k: _jsonable(v) for k, v in self.defaults().items()},
            "device": device,
            "available": reason is None,
            "reason": reason,
            "kernels": self.kernels_on(device),
        }

    def kernels_on(self, device: str) -> list[dict[str, Any]]:
        """Each implementation with its default options on `device` (CUDA: bfloat16, else float32;
        4 heads of 64, 4,096 tokens, causal where it can be): its summary, why it cannot run
        there (None: it can) and whether auto picks it."""
        table = getattr(self.cls, "kernels", None)
        if table is None:
            return []
        device = torch.device(device).type
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        try:
            with torch.device("meta"):
                core = self.cls(self.make_config(), causal=self.caps.causal)
        except (ZooError, TypeError):  # no defaults to build it with (a plugin's required option)
            return []
        call = Call(device, dtype, 4096, 64)
        try:
            auto = core.pick(call).name
        except ZooError:
            auto = None
        return [
            {
                "name": impl.name,
                "summary": impl.summary,
                "reason": "; ".join(impl.reasons(core, call)) or None,
                "auto": impl.name == auto,
            }
            for impl in table.implementations
        ]


def kv_heads_refusal(spec: BackendSpec) -> str:
    """The one line a backend without shared KV heads answers when given kv_heads."""
    why = ": it shares q and k, so keys have the queries' heads" if spec.caps.shared_qk else ""
    takers = backends_where(lambda s: "kv_heads" in field_names(s.config))
    return (
        f"backend {spec.name!r} takes no kv_heads (shared KV heads){why}; "
        f"backends that do: {', '.join(takers)}"
    )


def _jsonable(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    return value


BACKENDS: Registry[BackendSpec] = Registry("attention backend")


def register_attention(
    name: str,
    *,
    config: type,
    caps: Capabilities = Capabilities(),
    description: str = "",
    availability: Callable[[str], str | None] = always_available,
    variants: tuple[dict[str, Any], ...] = (),
    replace: bool = False,
) -> Callable[[type[nn.Module]], type[nn.Module]]:
    """Class decorator: register an attention core under `name` (usable from user code)."""
    if not dataclasses.is_dataclass(config):
        raise TypeError(f"config for {name!r} must be a dataclass type, got {config!r}")

    def wrap(cls: type[nn.Module]) -> type[nn.Module]:
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise TypeError(f"attention {name!r} must be an nn.Module subclass, got {cls!r}")
        summary = description or next(iter((cls.__doc__ or "").strip().splitlines()), "")
        spec = BackendSpec(
            name=name,
            cls=cls,
            config=config,
            caps=caps,
            description=summary,
            availability=availability,
            variants=tuple(variants),
        )
        BACKENDS.add(name, spec, replace=replace, origin=origin_of(cls))
        cls.spec = spec
        return cls

    return wrap


def get_backend(name: str) -> BackendSpec:
    return BACKENDS.get(name)


def list_backends() -> list[BackendSpec]:
    """Every registered backend spec, in registration order."""
    return list(BACKENDS)


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def build_attention(
    name: str, *, causal: bool = False, device: str | torch.device | None = None, **options: Any
) -> nn.Module:
    """Build the attention core `name`; `forward(q, k, v, key_padding_mask=None)` on (b, h, n, d).

    `device` is where it will run (default: CUDA when present, else CPU); a backend that cannot run
    there raises UnavailableError with the reason.
    """
    spec = get_backend(name)
    device = torch.device(device).type if device is not None else default_device()
    if reason := spec.unavailable_reason(device):
        raise UnavailableError(f"backend {name!r} is unavailable: {reason}")
    if causal and not spec.caps.causal:
        raise OptionError(causal_error(name))
    if not causal and not spec.caps.non_causal:
        raise OptionError(f"backend {name!r} only runs causally; pass causal=True")
    cfg = spec.make_config(**options)
    kernels = getattr(spec.cls, "kernels", None)  # a table of its own: the kernel must name it
    if kernels is not None and hasattr(cfg, "kernel") and "attend" not in kernels.by_name:
        kernels.check_option(name, cfg.kernel)
    # Values drawn on the CPU, then moved: a seed gives the same initial values on every device.
    # On the CPU, on meta and under a fake mode (its tensors cannot be moved): built in place.
    moved = device not in ("cpu", "meta") and detect_fake_mode() is None
    with torch.device("cpu" if moved else device):
        core = spec.cls(cfg, causal=causal)
    return core.to(device) if moved else core


def backends_where(keep: Callable[[BackendSpec], bool]) -> list[str]:
    """Names of the registered backends `keep` accepts, in registration order."""
    return [s.name for s in BACKENDS if keep(s)]


def causal_error(name: str, fix: str = "run it with causal=False") -> str:
    """One line for a bidirectional-only backend asked to run causally: what works instead (`fix`:
    how the caller turns causal off)."""
    return (
        f"backend {name!r} cannot run causally (it is bidirectional only); {fix}, "
        f"or use a causal backend: {', '.join(backends_where(lambda s: s.caps.causal))}"
    )


__all__ = [
    "ALL_DEVICES",
    "ALL_DTYPES",
    "BACKENDS",
    "BackendSpec",
    "Capabilities",
    "RunTarget",
    "backends_where",
    "build_attention",
    "causal_error",
    "default_device",
    "get_backend",
    "list_backends",
    "register_attention",
]
