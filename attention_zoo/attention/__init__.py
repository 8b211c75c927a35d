"""Attention cores. Importing this package registers every built-in backend (explicit imports)."""

# Registration order is list order, so these imports keep their order.
# isort: off
from . import full, sdpa, xformers_kernel, shared_qk, local, lsh  # noqa: F401

# isort: on
from .base import AttentionCore, check_qkv
from .spec import (
    BACKENDS,
    BackendSpec,
    Capabilities,
    Case,
    build_attention,
    get_backend,
    list_backends,
    register_attention,
)

__all__ = [
    "BACKENDS",
    "AttentionCore",
    "BackendSpec",
    "Capabilities",
    "Case",
    "build_attention",
    "check_qkv",
    "get_backend",
    "list_backends",
    "register_attention",
]
