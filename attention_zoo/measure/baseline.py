"""Deterministic metrics of a fixed set of cases, compared against a baseline file kept in the repo.

FLOPs, predicted peak bytes (FakeTensors) and tracked peak bytes (storages counted on CPU) do not
depend on machine load, so unlike timings they can gate CI exactly: a change that makes a backend
use more memory or work fails, and so does one that uses less until the baseline is regenerated
(keeping it tight). Regenerate with `python benchmarks/scripts/update_baselines.py`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ..attention.spec import BACKENDS
from ..blocks.residual import RESIDUALS
from .cases import BenchCase, build_runnable
from .metrics import baselined
from .predict import predict_case
from .timing import fixed_threads
from .tracker import tracked_peak

DEFAULT_PATH = (
    Path(__file__).resolve().parents[2] / "benchmarks" / "baselines" / "deterministic.json"
)
# The deterministic metrics of the catalogue, each with its relative tolerance.
TOLERANCE = {m.name: m.tolerance for m in baselined()}
METRICS = tuple(TOLERANCE)
MODEL_LAYERS = ("local", "lsh")  # the attention of the model cases (one per residual variant)


def baseline_cases() -> list[BenchCase]:
    """Every registered backend's core at 1000 and 2048 tokens (1000 is not a chunk multiple) and
    its SelfAttention block at 1000, forward and forward+backward, plus a 2-layer local/lsh model
    training step per registered residual variant."""
    cases = []
    for backend in BACKENDS.names():
        for target, n in (("attention", 1000), ("attention", 2048), ("block", 1000)):
            for mode in ("forward", "forward+backward"):
                cases.append(
                    BenchCase(target=target, backend=backend, seq_len=n, mode=mode, causal=True)
                )
    for residual in RESIDUALS.names():
        cases.append(
            BenchCase(
                target="model",
                backend="+".join(MODEL_LAYERS),
                seq_len=1024,
                mode="train-step",
                model={
                    "attn_layers": list(MODEL_LAYERS),
                    "num_hidden_layers": 2,
                    "residual": residual,
                    "hidden_dropout_prob": 0.0,
                },
            )
        )
    return cases


def case_available(case: BenchCase) -> str | None:
    """Why a baseline case cannot be computed here (a backend not registered or unavailable on
    CPU), or None."""
    missing = [b for b in case.backends() if b not in BACKENDS]
    if missing:
        return f"backend(s) {missing} not registered"
    return case.unsupported("cpu")


def compute(case: BenchCase) -> dict[str, int]:
    """The deterministic metrics of one case (single thread: tracked bytes do not depend on it)."""
    with fixed_threads(1):
        p = predict_case(case)
        runnable = build_runnable(case)
        runnable.step()
        _, tracked = tracked_peak(runnable.step)
    values = {
        "flops": p.flops,
        "predicted_peak_bytes": p.peak_bytes,
        "tracked_peak_bytes": tracked.peak_bytes,
    }
    return {metric: values[metric] for metric in METRICS}


def compare(expected: dict[str, int], actual: dict[str, int]) -> list[str]:
    """Differences beyond the tolerance, as readable lines (empty: within tolerance)."""
    problems = []
    for metric in METRICS:
        if metric not in expected:
            continue
        want, got = expected[metric], actual[metric]
        tol = TOLERANCE[metric] * max(want, 1)
        if abs(got - want) > tol:
            direction = (
                "MORE (a regression?)"
                if got > want
                else "less (an improvement: regenerate the baseline)"
            )
            problems.append(
                f"{metric}: {got:,} vs baseline {want:,} "
                f"({(got - want) / max(want, 1):+.2%}), {direction}"
            )
    return problems


def load(path: Path = DEFAULT_PATH) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def generate(path: Path = DEFAULT_PATH) -> dict[str, Any]:
    """Compute every available baseline case and write the file; returns its content."""
    entries = {}
    for case in baseline_cases():
        if case_available(case) is None:
            entries[case.key()] = {"case": case.to_dict(), "name": case.name(), **compute(case)}
    data = {
        "about": "Deterministic metrics of attention_zoo.measure.baseline.baseline_cases(); "
        "regenerate with: python benchmarks/scripts/update_baselines.py",
        "torch_version": torch.__version__,
        "tolerance": TOLERANCE,
        "cases": entries,
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return data
