"""attention-zoo: interchangeable attention backends in one Reformer skeleton, measured honestly."""

import importlib
from typing import Any

from .attention import (
    AttentionCore,
    BackendSpec,
    Capabilities,
    RunTarget,
    build_attention,
    get_backend,
    list_backends,
    register_attention,
)
from .blocks import SelfAttention
from .config import ReformerConfig
from .errors import (
    ConfigError,
    OptionError,
    ShapeError,
    UnavailableError,
    UnknownNameError,
    ZooError,
)
from .model import (
    ReformerForSequenceClassification,
    ReformerLM,
    ReformerLMOutput,
    ReformerModel,
    ReformerOutput,
)
from .registry import Registry
from .store import ResultStore, StoreError
from .version import __version__

# The task and reproduction registries load on first use (`attention_zoo.TASKS`, or importing
# their packages, which registers every built-in first): a command that needs neither, such as a
# refused `zoo bench`, does not pay for the report and training code they import.
_LAZY = {"REPRODUCTIONS": ".reproduce", "TASKS": ".tasks"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "REPRODUCTIONS",
    "TASKS",
    "AttentionCore",
    "BackendSpec",
    "Capabilities",
    "ConfigError",
    "OptionError",
    "ReformerConfig",
    "ReformerForSequenceClassification",
    "ReformerLM",
    "ReformerLMOutput",
    "ReformerModel",
    "ReformerOutput",
    "Registry",
    "ResultStore",
    "RunTarget",
    "SelfAttention",
    "ShapeError",
    "StoreError",
    "UnavailableError",
    "UnknownNameError",
    "ZooError",
    "__version__",
    "build_attention",
    "get_backend",
    "list_backends",
    "register_attention",
]
