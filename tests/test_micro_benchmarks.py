"""The pytest-benchmark micro-benchmarks (benchmarks/micro) cover every registered backend, a newly
registered one with no other edit, and stay out of the test suite's collection."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from attention_zoo import AttentionCore, Capabilities, register_attention
from attention_zoo.attention.spec import BACKENDS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
MICRO = ROOT / "benchmarks" / "micro" / "test_backends.py"


def _micro() -> ModuleType:
    spec = importlib.util.spec_from_file_location("zoo_micro_benchmarks", MICRO)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True, kw_only=True)
class _ProbeConfig:
    """No options."""


def test_one_case_per_backend_length_and_mode_a_new_backend_included() -> None:
    micro = _micro()
    per_backend = len(micro.LENGTHS) * len(micro.MODES)
    counts = Counter(c.backend for c in micro.micro_cases())
    assert counts == dict.fromkeys(BACKENDS.names(), per_backend)

    @register_attention("micro-probe", config=_ProbeConfig, caps=Capabilities())
    class ProbeAttention(AttentionCore):
        """Full attention under another name."""

        def attend(self, q, k, v, key_padding_mask):
            return (q @ k.transpose(-1, -2)).softmax(-1) @ v

    try:
        assert Counter(c.backend for c in micro.micro_cases())["micro-probe"] == per_backend
    finally:
        BACKENDS.remove("micro-probe")


def test_the_test_suite_does_not_collect_the_micro_benchmarks() -> None:
    pytest_options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    assert pytest_options["ini_options"]["testpaths"] == ["tests"]
    assert "--benchmark-disable" not in pytest_options["ini_options"]["addopts"]


@pytest.mark.slow
def test_the_documented_command_times_under_the_projects_xdist_addopts() -> None:
    """pytest-benchmark switches itself off under xdist, which pyproject's addopts turn on; the
    micro-benchmarks' conftest runs them in one process, so `--benchmark-only` times them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # not a worker
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "benchmarks/micro", "--benchmark-only", "-q",
         "-k", "sdpa and 256 and forward and not backward", "-p", "no:cacheprovider",
         "--benchmark-max-time=0.01", "--benchmark-min-rounds=1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "test_core[sdpa-256-forward]" in run.stdout and "1 passed" in run.stdout
