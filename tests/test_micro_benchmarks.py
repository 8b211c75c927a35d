"""The pytest-benchmark micro-benchmarks (benchmarks/micro) cover every registered backend, a newly
registered one with no other edit, and stay out of the test suite's collection."""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

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
