"""The Reformer (Kitaev, Kaiser, Levskaya 2020; the Hugging Face blog post on it): claims a-e on
memory (experiments.py, measured as resumable sweeps), claim f on Table 2's pattern (the
duplication task), their published numbers (published.py), verdicts (claims.py) and Table 2 beside
the paper's in the report (table2.py).
"""

from __future__ import annotations

from typing import Any

from ...report.claims import ClaimRow
from ...report.context import Context
from ...store import ResultStore
from ...sweep import SweepResult
from ..base import Reproduction, RunOptions, TaskRun, register_reproduction
from . import claims as reformer_claims
from .claims import TASK
from .experiments import run_reformer
from .published import BLOG, TABLE2_CITATION
from .table2 import table2_section


@register_reproduction
class Reformer(Reproduction):
    """The Reformer's claims: memory of its features (a-e) and Table 2's pattern (f)."""

    name = "reformer"
    gpu_sizes = ("paper",)
    title = "The Reformer's claims"
    description = (
        "memory of local+LSH attention, chunked FFN, reversible residuals, axial positions; "
        "Table 2's pattern"
    )
    sources = (BLOG, TABLE2_CITATION)
    plots = ("table2-*.png",)

    def announce(self, size: str, device: str, store: str) -> list[str]:
        lines = [f"reproducing the Reformer's claims, size {size}, on {device} -> {store}"]
        if size == "paper" and device == "cpu":
            lines.append(
                "no CUDA device here: the paper-size memory numbers are predicted (meta device)"
            )
        return lines

    def run(self, size: str, store: ResultStore, options: RunOptions) -> list[SweepResult]:
        return run_reformer(size, store, options)

    def task_runs(self, size: str) -> tuple[TaskRun, ...]:
        # claim f at the scale's duplication preset; long except at smoke size
        return (
            TaskRun(task=TASK, preset=size, title="Table 2 (claim f)", optional=size != "smoke"),
        )

    def claims(self, rows: Any) -> list[ClaimRow]:
        return reformer_claims.claims(rows, self.defined_presets())

    def report_sections(self, ctx: Context) -> list[Any]:
        return table2_section(ctx, self.defined_presets())


__all__ = ["Reformer"]
