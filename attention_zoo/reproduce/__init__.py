"""Reproductions: run the experiments behind a paper's published claims into the results store.

`run_reformer` measures claims a-e of the Reformer (reproduce/reformer.py) as resumable sweeps (an
interrupted run continues where it stopped; a finished one is not measured again unless `fresh`),
stores claim d's parameter counts, and leaves claim f (Table 2) to the task engine.
`attention_zoo.report.claims.claims_table` turns the stored rows into verdicts.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from ..executors import Executor
from ..measure.metrics import metric_row
from ..measure.runner import MeasureSettings
from ..store import ResultStore
from ..sweep import SweepResult, default_memory_limit, run_sweep
from .reformer import SETTINGS, SIZES, experiments, parameter_models

KIND = "reproduce"
TASK_PRESETS = {"smoke": "smoke", "cpu": "cpu", "paper": "paper"}  # claim f: duplication preset


@dataclass
class Reproduction:
    """What one `run_reformer` call did."""

    size: str
    device: str
    predicted_only: bool  # measured claims were predicted (paper size without CUDA)
    sweeps: list[SweepResult]
    parameters_run: str


def run_reformer(
    size: str,
    store: ResultStore,
    *,
    device: str = "cpu",
    threads: int | None = None,
    fresh: bool = False,
    progress: bool = True,
    meta: dict[str, Any] | None = None,
    executor: Executor | None = None,
) -> Reproduction:
    """Measure claims a-e at `size` into `store`. Paper size on a CPU is predicted on the meta
    device (it would not fit or finish here); CPU cases predicted above 90% of the available
    memory are stored as oom with their prediction."""
    if size not in SIZES:
        raise ValueError(f"size {size!r} is not one of: {', '.join(SIZES)}")
    predicted_only = size == "paper" and device == "cpu"
    meta = {"reproduce": "reformer", "size": size, "note": SETTINGS[size].note, **(meta or {})}
    measured, predicted = [], []
    for exp in experiments(size, device=device):
        (predicted if exp.predicted_only or predicted_only else measured).extend(exp.cases)
    sweeps = []
    for cases, metrics, limit in (
        (measured, ("memory", "predict"), default_memory_limit() if device == "cpu" else None),
        (predicted, ("predict",), None),
    ):
        if cases:
            sweeps.append(
                run_sweep(
                    cases,
                    store,
                    settings=MeasureSettings(metrics=metrics, threads=threads),
                    resume=not fresh,
                    memory_limit_bytes=limit,
                    progress=progress,
                    meta=meta,
                    executor=executor,
                )
            )
    return Reproduction(
        size=size,
        device=device,
        predicted_only=predicted_only,
        sweeps=sweeps,
        parameters_run=store_parameter_counts(size, store, fresh=fresh, meta=meta),
    )


def count_parameters(model: dict[str, Any]) -> int:
    """Parameters of a ReformerModel (no LM head) with these config fields, built on the meta
    device (nothing allocated)."""
    import torch

    from ..config import ReformerConfig
    from ..model import ReformerModel

    with torch.device("meta"):
        built = ReformerModel(ReformerConfig.from_dict(model), device="meta")
    return sum(p.numel() for p in built.parameters())


def store_parameter_counts(
    size: str, store: ResultStore, *, fresh: bool = False, meta: dict[str, Any] | None = None
) -> str:
    """Store claim d's parameter counts (one case per position table) in a run of kind
    'reproduce'; returns its id (the latest such run is reused unless `fresh`)."""
    configs = {
        label: {"kind": "parameters", "label": label, "model": model}
        for label, model in parameter_models(size).items()
    }
    fingerprint = hashlib.sha1("\n".join(sorted(configs)).encode()).hexdigest()[:16]
    run_id = None if fresh else store.latest_run(kind=KIND, fingerprint=fingerprint)
    run_id = store.start_run(kind=KIND, run_id=run_id, fingerprint=fingerprint, meta=meta)
    for config in configs.values():
        count = count_parameters(config["model"])
        store.add_rows(run_id, None, config, [metric_row("parameters", count)])
    store.finish_run(run_id)
    return run_id


__all__ = [
    "KIND",
    "SIZES",
    "TASK_PRESETS",
    "Reproduction",
    "count_parameters",
    "run_reformer",
    "store_parameter_counts",
]
