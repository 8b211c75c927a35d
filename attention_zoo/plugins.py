"""Plugins: code outside attention-zoo that registers attention backends, tasks, residual variants,
reproductions.

Every `zoo` command (and the asv suite, the isolated worker and the test suite) loads, in order:
  - installed packages' entry points in the group `attention_zoo.plugins`, e.g. in pyproject.toml
    `[project.entry-points."attention_zoo.plugins"] mine = "my_pkg.attention"`; an entry point is a
    module (importing it registers) or a callable (called with no arguments);
  - the modules in the environment variable ZOO_IMPORT (comma-separated), which child processes
    inherit;
  - the modules given as `--import MODULE` (repeatable).
A module is a dotted name (found on sys.path or in the current folder) or a path to a .py file.
Each registry entry remembers where it came from (`Registry.origin`), which `zoo list` shows.
A plugin that fails to import is reported with its name and the error, and everything it
registered before failing is removed again, so the rest keeps working; a module asked for by name
(ZOO_IMPORT, --import) that fails is an error in every command and in the test suite.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Any

from .errors import PluginError
from .registry import Registry, pluggable_registries

ENTRY_POINT_GROUP = "attention_zoo.plugins"
ENV_VAR = "ZOO_IMPORT"
# The packages whose import registers the built-ins of every pluggable registry (the attention
# cores come with attention_zoo itself; tasks and reproductions load on first use).
BUILT_IN_PACKAGES = ("attention_zoo.tasks", "attention_zoo.reproduce")


@dataclass(frozen=True, kw_only=True)
class Plugin:
    """A plugin that loaded: its target (module, .py file, entry point) and how it was asked for."""

    target: str
    origin: str  # "plugin NAME (DIST)", "ZOO_IMPORT mod" or "--import mod"
    importable: bool  # a module name or path a child process can import again (not an entry point)


@dataclass(frozen=True, kw_only=True)
class PluginFailure:
    """A plugin that did not load, with the error it raised."""

    target: str
    origin: str
    error: str
    explicit: bool  # asked for by name (--import, ZOO_IMPORT): the command cannot go on without it

    def message(self) -> str:
        return f"{self.origin} failed to load: {self.error}"


PLUGINS: Registry[Plugin] = Registry("plugin", pluggable=False)


def load_plugins(modules: Sequence[str] = (), *, report: bool = True) -> list[PluginFailure]:
    """Load entry-point plugins, then ZOO_IMPORT, then `modules`; return the ones that failed.

    A plugin loaded before is not loaded again. report: write each failure as one line on stderr.
    """
    failures = []
    for ep in _entry_points():
        dist = f" ({ep.dist.name} {ep.dist.version})" if getattr(ep, "dist", None) else ""
        failures += _load(ep.name, f"plugin {ep.name!r}{dist}", lambda ep=ep: _call(ep.load()))
    for target in split_targets(os.environ.get(ENV_VAR, "")):  # asked for by name, as --import
        failures += _load(
            target, f"{ENV_VAR} {target}", lambda t=target: import_target(t), explicit=True
        )
    for target in modules:
        failures += _load(
            target, f"--import {target}", lambda t=target: import_target(t), explicit=True
        )
    if report:
        warn(failures)
    return failures


def warn(failures: Sequence[PluginFailure]) -> None:
    """One line on stderr per failure."""
    for failure in failures:
        print(f"zoo: warning: {failure.message()}; continuing without it", file=sys.stderr)


def load_plugins_for_command(modules: Sequence[str] = ()) -> None:
    """Every entry point's loading (the CLI, the test suite, the micro-benchmarks): a failing
    installed plugin is a warning, a failing ZOO_IMPORT or --import module (asked for by name)
    a PluginError."""
    failures = load_plugins(modules, report=False)
    warn([f for f in failures if not f.explicit])
    explicit = [f for f in failures if f.explicit]
    if explicit:
        raise PluginError(explicit[0].message())


def split_targets(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def child_environment() -> dict[str, str]:
    """os.environ with ZOO_IMPORT naming every imported plugin, for a child process to load them."""
    targets = split_targets(os.environ.get(ENV_VAR, ""))
    for plugin in PLUGINS:
        if plugin.importable and plugin.target not in targets:
            targets.append(plugin.target)
    env = dict(os.environ)
    if targets:
        env[ENV_VAR] = ",".join(targets)
    return env


def import_target(target: str) -> ModuleType:
    """Import a dotted module name (the current folder searched last) or a .py file."""
    if target.endswith(".py") or os.sep in target:
        return _import_file(Path(target))
    with _cwd_on_path():
        return importlib.import_module(target)


def _load(
    target: str, origin: str, load: Callable[[], object], *, explicit: bool = False
) -> list[PluginFailure]:
    if target in PLUGINS:
        return []
    for package in BUILT_IN_PACKAGES:  # every built-in registered before any plugin adds to it
        importlib.import_module(package)
    registries = pluggable_registries()
    before = [dict(_items(r)) for r in registries]
    try:
        load()
    except Exception as exc:  # a plugin's own bug must not break the command
        for registry, old in zip(registries, before):
            for name, item in _items(registry):
                if old.get(name) is not item:
                    registry.remove(name)
                    if name in old:
                        registry.add(name, old[name])
        return [
            PluginFailure(target=target, origin=origin, error=_describe(exc), explicit=explicit)
        ]
    for registry, old in zip(registries, before):
        for name, item in _items(registry):
            if old.get(name) is not item:
                registry.set_origin(name, origin)
    importable = not origin.startswith("plugin ")
    target_id = str(Path(target).resolve()) if target.endswith(".py") else target
    PLUGINS.add(target, Plugin(target=target_id, origin=origin, importable=importable))
    return []


def _items(registry: Registry[Any]) -> Iterator[tuple[str, Any]]:
    return zip(registry.names(), iter(registry))


def _call(obj: object) -> object:
    """An entry point naming a function is called; a module or class registered on import."""
    if callable(obj) and not isinstance(obj, type):
        return obj()
    return obj


def _entry_points() -> list[Any]:
    seen, out = set(), []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if (ep.name, ep.value) not in seen:
            seen.add((ep.name, ep.value))
            out.append(ep)
    return out


def _import_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise ModuleNotFoundError(f"no file {path}")
    name = path.stem
    module = sys.modules.get(name)
    if module is not None and getattr(module, "__file__", None) == str(path.resolve()):
        return module
    spec = importlib.util.spec_from_file_location(name, path.resolve())
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python module: give a .py file or a module's name")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


@contextmanager
def _cwd_on_path() -> Iterator[None]:
    """The current folder on sys.path (last) while importing, as `python -m` would have it."""
    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:
        sys.path.append(cwd)
    try:
        yield
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


def _describe(exc: BaseException) -> str:
    """'Type: message (at file:line)', the line being the deepest frame (the plugin's own)."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return " ".join(f"{type(exc).__name__}: {exc}{where}".split())


__all__ = [
    "ENTRY_POINT_GROUP",
    "ENV_VAR",
    "PLUGINS",
    "Plugin",
    "PluginFailure",
    "child_environment",
    "import_target",
    "load_plugins",
    "load_plugins_for_command",
    "warn",
]
