"""Shared test setup: deterministic seeds, few threads, GPU tests skipped cleanly without CUDA."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from attention_zoo import AttentionCore
from attention_zoo.attention.spec import BACKENDS, register_attention
from attention_zoo.errors import PluginError
from attention_zoo.measure import load
from attention_zoo.plugins import PLUGINS, load_plugins_for_command
from attention_zoo.registry import pluggable_registries

# One thread a pytest-xdist worker (a worker a core), else at most two.
torch.set_num_threads(
    1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, torch.get_num_threads())
)
# Installed plugins and ZOO_IMPORT modules join the registry-driven suites (the conformance suite
# of a user's own backend: ZOO_IMPORT=my_module python -m pytest tests/test_attention_contract.py).
try:
    load_plugins_for_command()
    _PLUGIN_ERROR = ""
except PluginError as err:  # a ZOO_IMPORT module that fails: no test may run without it
    _PLUGIN_ERROR = str(err)


def pytest_configure(config: pytest.Config) -> None:
    if _PLUGIN_ERROR:
        raise pytest.UsageError(f"{_PLUGIN_ERROR}; no test runs without it")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; none is visible")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _rates_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """This machine's attention rate (measure/rate.py) is cached in a folder of the test session,
    never the user's cache; subprocesses inherit it."""
    mp = pytest.MonkeyPatch()
    mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
    yield
    mp.undo()


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _idle_cpu_counters(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run samples the machine's load at its start and end (SAMPLE_S each); in tests the
    counters read as idle at once, unless a test is marked real_load."""
    if "real_load" in request.keywords:
        return
    ticks = iter(range(0, 10**12, 100))
    monkeypatch.setattr(load, "SAMPLE_S", 0.0)
    monkeypatch.setattr(load, "_cpu_times", lambda: (0, next(ticks)))


@contextmanager
def registrations_undone() -> Iterator[None]:
    """Whatever is registered while open (backends, tasks, plugins...) is removed on exit, with
    the plugin modules imported meanwhile, so no later test or child process sees them."""
    registries = [*pluggable_registries(), PLUGINS]
    before = {id(r): set(r.names()) for r in registries}
    modules = set(sys.modules)
    try:
        yield
    finally:
        added = {
            Path(t).stem if t.endswith(".py") else t
            for t in set(PLUGINS.names()) - before[id(PLUGINS)]
        }
        for registry in registries:
            for name in set(registry.names()) - before[id(registry)]:
                registry.remove(name)
        for name in set(sys.modules) - modules:
            if name.startswith("zoo_") or any(name == t or name.startswith(f"{t}.") for t in added):
                del sys.modules[name]


@pytest.fixture(autouse=True)
def _no_registration_outlives_its_test() -> Iterator[None]:
    """Every test's registrations and plugin modules are undone after it, asked for or not: an
    in-process `zoo` command with ZOO_IMPORT set registers its plugins, and a later test in the
    same worker would see them (whichever tests a worker happens to share)."""
    with registrations_undone():
        yield


@pytest.fixture
def clean_registries(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A test's registrations and plugins removed afterwards (registrations_undone), and no
    ZOO_IMPORT of the caller's taken in."""
    monkeypatch.delenv("ZOO_IMPORT", raising=False)
    with registrations_undone():
        yield


@dataclass(frozen=True, kw_only=True)
class _NoOptions:
    """No options."""


@pytest.fixture
def bad_backends():
    """Two injected backends: one raising an ordinary error, one an allocator out-of-memory one."""

    @register_attention("test-failing", config=_NoOptions)
    class Failing(AttentionCore):
        def attend(self, q, k, v, key_padding_mask):
            raise ValueError("injected failure")

    @register_attention("test-oom", config=_NoOptions)
    class OutOfMemory(AttentionCore):
        def attend(self, q, k, v, key_padding_mask):
            if q.device.type == "meta" or type(q).__name__ == "FakeTensor":
                return q  # predictable; only the real run fails
            raise RuntimeError(
                "[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: "
                "you tried to allocate 1099511627776 bytes"
            )

    yield
    BACKENDS.remove("test-failing")
    BACKENDS.remove("test-oom")
