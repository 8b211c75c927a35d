"""attention-zoo: interchangeable attention backends in one Reformer skeleton, measured honestly."""

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
from .model import ReformerLM, ReformerLMOutput, ReformerModel, ReformerOutput
from .registry import Registry
from .store import ResultStore, StoreError

__version__ = "0.1.0"

__all__ = [
    "AttentionCore",
    "BackendSpec",
    "Capabilities",
    "ConfigError",
    "OptionError",
    "ReformerConfig",
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
    "build_attention",
    "get_backend",
    "list_backends",
    "register_attention",
]
