"""Reproductions: one paper each, in its own folder, registered by name (`zoo reproduce --list`).

base.py says what a reproduction is (`Reproduction`, `register_reproduction`, `REPRODUCTIONS`);
importing this package registers the built-in ones, a folder each.
"""

from . import (  # noqa: F401  (registers the built-in ones)
    lra_listops,
    niah,
    reformer,
    selective_copying,
    state_tracking,
    zoology,
)
from .base import (
    GPU_SIZE,
    OWN_SETTINGS,
    PRESETS,
    REPRODUCTIONS,
    SIZES,
    ClaimRow,
    Reproduction,
    RunOptions,
    TaskRun,
    claims_frame,
    get_reproduction,
    list_reproductions,
    register_reproduction,
    render_claims,
)
from .stored import StoredCase, stored_cases, task_cases

__all__ = [
    "GPU_SIZE",
    "OWN_SETTINGS",
    "PRESETS",
    "REPRODUCTIONS",
    "SIZES",
    "ClaimRow",
    "Reproduction",
    "RunOptions",
    "StoredCase",
    "TaskRun",
    "claims_frame",
    "get_reproduction",
    "list_reproductions",
    "register_reproduction",
    "render_claims",
    "stored_cases",
    "task_cases",
]
