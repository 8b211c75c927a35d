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
from .model import (
    ReformerForSequenceClassification,
    ReformerLM,
    ReformerLMOutput,
    ReformerModel,
    ReformerOutput,
)
from .registry import Registry
from .reproduce import REPRODUCTIONS  # registers every built-in reproduction before any plugin
from .store import ResultStore, StoreError
from .tasks import TASKS  # importing the package registers every built-in before any plugin
from .version import __version__

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
