"""Shared test setup: deterministic seeds, few threads, GPU tests skipped cleanly without CUDA."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

from attention_zoo.errors import PluginError
from attention_zoo.measure import load
from attention_zoo.plugins import load_plugins_for_command

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
