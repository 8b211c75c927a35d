"""attention-zoo: interchangeable attention backends in one Reformer skeleton, measured honestly."""

from .attention import (
    AttentionCore,
    BackendSpec,
    Capabilities,
    Case,
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

__version__ = "0.1.0"

__all__ = [
    "AttentionCore",
    "BackendSpec",
    "Capabilities",
    "Case",
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
    "SelfAttention",
    "ShapeError",
    "StoreError",
    "UnavailableError",
    "UnknownNameError",
    "ZooError",
    "build_attention",
    "get_backend",
    "list_backends",
    "register_attention",
]
