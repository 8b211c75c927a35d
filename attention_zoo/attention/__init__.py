"""Attention cores. Importing this package registers every built-in backend (explicit imports).

Layout: one module per backend (full, sdpa, xformers, shared_qk, local, lsh, sliding_window,
bigbird, linear, performer, nystrom, linformer, retention, gla, deltanet, gated_deltanet, sigmoid,
differential, moba, nsa: its option dataclass and its registered core; the recurrences share
recurrent.py); `dispatch.py` is the one rule that picks an implementation;
`kernels/` holds what they compute with (dense math, chunked windows and their fused kernels and
backward, LSH hashing, plan and fused Function, gathered key blocks, materialised references, the
kernelised prefix sums, the chunked recurrences).

Mechanism vs kernel, one rule: a backend name is a mechanism with one implementation family
(`full` materialises scores, `sdpa` calls PyTorch's SDPA, `xformers` calls xformers: same math,
separate names, because they are different libraries with their own availability). Options change
what is computed (window sizes, hash rounds, `semantics`); `kernel=` only picks an implementation
of the same computation within a backend, with equal results up to rounding.
"""

# Registration order is list order, so these imports keep their order.
# isort: off
from . import full, sdpa, xformers, shared_qk, local, lsh, sliding_window, bigbird  # noqa: F401
from . import linear, performer, nystrom, linformer  # noqa: F401
from . import retention, gla, deltanet, gated_deltanet  # noqa: F401
from . import sigmoid, differential  # noqa: F401
from . import moba, nsa  # noqa: F401

# isort: on
from .base import AttentionCore, check_qkv
from .spec import (
    BACKENDS,
    BackendSpec,
    Capabilities,
    RunTarget,
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
    "RunTarget",
    "build_attention",
    "check_qkv",
    "get_backend",
    "list_backends",
    "register_attention",
]
