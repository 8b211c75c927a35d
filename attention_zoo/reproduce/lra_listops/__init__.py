"""LRA ListOps (Tay et al. 2021, Table 1): every bidirectional backend trained on the listops task
(zoo task listops --preset SIZE), beside LRA's published accuracies (claims.py)."""

from __future__ import annotations

from typing import Any

from ...report.claims import ClaimRow
from ..base import Reproduction, TaskRun, register_reproduction
from ..training import task_rows
from . import claims as table1
from .claims import SOURCE, TASK


@register_reproduction
class LRAListOps(Reproduction):
    """LRA's ListOps row: each mechanism's accuracy gap to full attention, beside LRA's."""

    name = "lra-listops"
    title = "LRA ListOps (Table 1)"
    description = "ListOps accuracy of every bidirectional backend beside LRA's Table 1"
    sources = (SOURCE,)

    def task_runs(self, size: str) -> tuple[TaskRun, ...]:
        return (TaskRun(task=TASK, preset=size, title="LRA ListOps"),)

    def claims(self, rows: Any) -> list[ClaimRow]:
        tidy = task_rows(rows)
        presets = sorted({r["preset"] for r in tidy if r["task"] == TASK}) or ["cpu"]
        return [line for preset in presets for line in table1.claims(tidy, preset)]


__all__ = ["LRAListOps"]
