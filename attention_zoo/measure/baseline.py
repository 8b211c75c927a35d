"""Deterministic metrics of a fixed set of cases, compared against a baseline file kept in the repo.

FLOPs, predicted peak bytes (shapes only), tracked peak bytes (storages counted on CPU) and the
approx_error of approximate backends (seeded inputs) do not depend on machine load, so unlike
timings they can gate CI exactly: a change that makes a backend use more memory or work (or
approximate worse) fails, and so does one that uses less until someone has looked at why and
regenerated the baseline (keeping it tight). Regenerate with
`python benchmarks/scripts/update_baselines.py`, which compares time first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..attention.spec import BACKENDS
from ..blocks.residual import RESIDUALS
from .cases import BenchCase
from .metrics import METRICS as CATALOGUE
from .metrics import baselined
from .runner import MeasureSettings, measure_case
from .status import OK

# The checkout's file, read by the tests and benchmarks/scripts (no zoo command reads it, so it is
# not package data).
DEFAULT_PATH = (
    Path(__file__).resolve().parents[2] / "benchmarks" / "baselines" / "deterministic.json"
)
# The deterministic metrics of the catalogue, each with its relative tolerance.
TOLERANCE = {m.name: m.tolerance for m in baselined()}
METRICS = tuple(TOLERANCE)
# approx_error: measured for approximate backends only, and a ratio (the rest are integer counts)
RATIOS = frozenset(m for m in METRICS if CATALOGUE[m].group == "fidelity")
# The runner's settings for them: no timing, one thread (the counts do not depend on threads).
SETTINGS = MeasureSettings(
    threads=1, metrics=tuple(dict.fromkeys(m.group for m in baselined())), memory_limit_bytes=None
)
MODEL_LAYERS = ("local", "lsh")  # the attention of the model cases (one per residual variant)
# Token counts: one that is not a multiple of any chunk (local's and lsh's default chunks are 64),
# where padding to whole chunks shows, and multiples of them for the core and the model.
NOT_CHUNK_MULTIPLE = 1000
CORE_MULTIPLE, MODEL_MULTIPLE = 2048, 1024
QUICK_LENGTH = 200  # the quick pass's cases: short (seconds for all backends), not a chunk multiple


def baseline_cases() -> list[BenchCase]:
    """Every registered backend's core at 1000 and 2048 tokens (1000 is not a chunk multiple) and
    its SelfAttention block at 1000, forward and forward+backward, plus a 2-layer local/lsh model
    training step per registered residual variant at 1000 and 1024 tokens; and the quick pass's
    cases (quick_cases)."""
    cases = []
    for backend in BACKENDS.names():
        cases.append(
            BenchCase(backend=backend, seq_len=QUICK_LENGTH, mode="forward+backward", causal=True)
        )
        for target, n in (
            ("attention", NOT_CHUNK_MULTIPLE),
            ("attention", CORE_MULTIPLE),
            ("block", NOT_CHUNK_MULTIPLE),
        ):
            for mode in ("forward", "forward+backward"):
                cases.append(
                    BenchCase(target=target, backend=backend, seq_len=n, mode=mode, causal=True)
                )
    for residual in RESIDUALS.names():
        for n in (NOT_CHUNK_MULTIPLE, MODEL_MULTIPLE):
            cases.append(
                BenchCase(
                    target="model",
                    backend="+".join(MODEL_LAYERS),
                    seq_len=n,
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


def quick_cases() -> list[BenchCase]:
    """The quick test pass's part of baseline_cases(): each backend's core, forward+backward, at
    QUICK_LENGTH tokens (padding to whole chunks and the backward included, in seconds)."""
    return [c for c in baseline_cases() if c.seq_len == QUICK_LENGTH]


def case_available(case: BenchCase) -> str | None:
    """Why a baseline case cannot be computed here (a backend not registered or unavailable on
    CPU), or None."""
    missing = [b for b in case.backends() if b not in BACKENDS]
    if missing:
        return f"backend(s) {missing} not registered"
    return case.unsupported("cpu")


def compute(case: BenchCase) -> dict[str, float]:
    """The deterministic metrics of one case, measured by the runner as `zoo bench` measures them
    (approx_error only for approximate backends); RuntimeError with the runner's reason when the
    case does not run."""
    result = measure_case(case, SETTINGS)
    values = {metric: result.value(metric) for metric in METRICS}
    missing = [m for m, v in values.items() if v is None and m not in RATIOS]
    if result.status != OK or missing:
        reason = result.error or f"no {', '.join(missing)} measured"
        raise RuntimeError(f"{case.name()}: {result.status}: {reason}")
    return {m: (v if m in RATIOS else int(v)) for m, v in values.items() if v is not None}


@dataclass(frozen=True, kw_only=True)
class Difference:
    """One metric of one case off its baseline by more than the tolerance."""

    metric: str
    baseline: float
    actual: float

    @property
    def increase(self) -> bool:
        return self.actual > self.baseline

    @property
    def ratio(self) -> float:
        return self.actual / self.baseline if self.baseline else float("inf")

    def message(self) -> str:
        numbers = (
            f"{self.metric}: {self.actual:,} now vs {self.baseline:,} in the baseline "
            f"({self.ratio:.3f}x, {self.actual - self.baseline:+,})"
        )
        if self.increase:
            return f"{numbers}: MORE than the baseline, a regression unless the change meant it"
        return (
            f"{numbers}: LESS than the baseline. Look before regenerating: a drop is a saving only "
            "if the same work is still done (no mask, gradient, hash round or output lost); check "
            "the tests and the time (benchmarks/scripts/gate.py --head worktree)"
        )


def compare(expected: dict[str, float], actual: dict[str, float]) -> list[Difference]:
    """The metrics of `actual` off `expected` by more than their tolerance (empty: all within)."""
    differences = []
    for metric in METRICS:
        if metric not in expected:
            continue
        want, got = expected[metric], actual[metric]
        if abs(got - want) > TOLERANCE[metric] * max(want, 1):
            differences.append(Difference(metric=metric, baseline=want, actual=got))
    return differences


def load(path: Path = DEFAULT_PATH) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def entry(case: BenchCase) -> dict[str, Any]:
    """A baseline file's record of `case`: the case, its name and its computed metrics."""
    return {"case": case.to_dict(), "name": case.name(), **compute(case)}


def write(entries: dict[str, dict[str, Any]], path: Path = DEFAULT_PATH) -> dict[str, Any]:
    """Write the baseline file from records keyed by case key; returns its content."""
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
