"""How attention-zoo was installed, so a hint to install an extra names a command that fits:
an editable checkout (or code run from one) gets `pip install -e '.[EXTRA]'`, an installed
wheel or sdist `pip install 'attention-zoo[EXTRA]'` (pip's direct_url.json tells them apart)."""

from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

DISTRIBUTION = "attention-zoo"


def in_checkout() -> bool:
    """Code imported from a source checkout (pyproject.toml beside the package): editable, whatever
    metadata a build left on sys.path (an attention_zoo.egg-info in the current folder)."""
    return (Path(__file__).resolve().parents[1] / "pyproject.toml").is_file()


def editable() -> bool:
    """True for an editable install, and for code not installed at all (run from a checkout)."""
    if in_checkout():
        return True
    try:
        text = distribution(DISTRIBUTION).read_text("direct_url.json")
    except PackageNotFoundError:
        return True
    if not text:  # installed from an index: no direct URL
        return False
    try:
        return bool(json.loads(text).get("dir_info", {}).get("editable", False))
    except (ValueError, AttributeError):
        return False


def install_hint(extra: str) -> str:
    """The pip command that adds `extra` (report, ray, ...) to this installation."""
    if editable():
        return f"pip install -e '.[{extra}]'"
    return f"pip install '{DISTRIBUTION}[{extra}]'"
