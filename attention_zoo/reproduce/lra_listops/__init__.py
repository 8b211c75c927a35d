"""LRA ListOps (Tay et al. 2021, Table 1): every bidirectional backend trained on the listops task
(the suite's preset of the size, with its own attention options or LRA's: settings.py), beside
LRA's published accuracies (claims.py)."""

from __future__ import annotations

from typing import Any

from ...report.claims import ClaimRow
from ...store import ResultStore
from ...sweep import SweepResult
from ...tasks.suite import TaskPreset
from ..base import GPU_SIZE, PRESETS, Reproduction, RunOptions, register_reproduction
from ..training import task_rows, train_presets
from . import claims as table1
from .claims import SOURCE
from .settings import (
    LRA_SETTINGS,
    SETTINGS,
    TASK,
    listops_preset,
    scale_text,
    stored_presets,
)

GPU_SIZES = (GPU_SIZE, "paper")


@register_reproduction
class LRAListOps(Reproduction):
    """LRA's ListOps row: each mechanism's accuracy gap to full attention, beside LRA's."""

    name = "lra-listops"
    gpu_sizes = GPU_SIZES
    title = "LRA ListOps (Table 1)"
    description = "ListOps accuracy of every bidirectional backend beside LRA's Table 1"
    sources = (SOURCE,)
    sizes = PRESETS
    settings = SETTINGS

    def announce(self, size: str, device: str, store: str) -> list[str]:
        preset = listops_preset(size)
        return [
            f"reproducing {self.title}, size {size}, on {device} -> {store}",
            f"listops / preset {size}: {scale_text(preset)}; seeds "
            + ",".join(map(str, preset.grid.seeds)),
        ]

    def trained_presets(self, size: str) -> list[TaskPreset]:
        return [listops_preset(size, settings) for settings in self.settings]

    def run(self, size: str, store: ResultStore, options: RunOptions) -> list[SweepResult]:
        preset = listops_preset(size, options.settings)
        train_presets([preset], store, options, reproduce=self.name, size=size)
        return []

    def claims(self, rows: Any) -> list[ClaimRow]:
        tidy = task_rows(rows, self.defined_presets())
        names = stored_presets(tuple(self.defined_sizes()))
        found = [n for n in names if any((r["task"], r["preset"]) == (TASK, n) for r in tidy)]
        found = found or ["cpu"]
        out = []
        for name in found:
            size, settings = names[name]
            preset = listops_preset(size, settings)
            words = "LRA's attention settings" if settings == LRA_SETTINGS else "preset settings"
            why = table1.NO_CPU_PRESET if size == "cpu" else ""
            out += table1.claims(tidy, name, words, scale_text(preset), why)
        return out


__all__ = ["LRAListOps"]
