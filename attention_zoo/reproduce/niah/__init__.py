"""Needle in a haystack as the context outgrows a fixed state (RULER's NIAH variants on a length
ladder): softmax attention keeps its accuracy, recurrences of equal state fall (ladder.py), with
one accuracy-vs-length plot per variant trained (plot.py)."""

from __future__ import annotations

from typing import Any

from ...report.claims import ClaimRow
from ...report.context import Context
from ...report.document import Heading, Image, Para, narrow_tables
from ...tasks.suite import TaskPreset
from ..base import GPU_SIZE, register_reproduction
from ..training import TaskReproduction, report_rows, task_rows
from .ladder import (
    SIZES,
    SOURCES,
    claims,
    ladder_presets,
    rung_lengths,
    rungs,
    scale_text,
    table,
)
from .plot import plot


@register_reproduction
class NeedleLadder(TaskReproduction):
    """Retrieval accuracy against context length, per mechanism, on RULER's NIAH variants."""

    name = "niah"
    gpu_sizes = (GPU_SIZE,)
    title = "Needle in a haystack: retrieval as the context outgrows a fixed state"
    description = "NIAH accuracy vs length: softmax attention against fixed-state recurrences"
    sources = SOURCES
    sizes = tuple(SIZES)
    plots = ("niah-*.png",)

    def announce(self, size: str, device: str, store: str) -> list[str]:
        lines = [f"reproducing {self.title}, size {size}, on {device} -> {store}"]
        for preset in ladder_presets(size):
            lines.append(
                f"niah / preset {preset.name}: {preset.task.variant}, {preset.task.haystack} "
                f"haystack; {scale_text(preset)}; backends {', '.join(preset.grid.backends)}; "
                f"seeds {','.join(map(str, preset.grid.seeds))}"
            )
        return lines

    def trained_presets(self, size: str) -> list[TaskPreset]:
        return [rung for preset in ladder_presets(size) for rung in rungs(preset)]

    def ladders(self) -> list[TaskPreset]:
        """The ladder presets of every size the suite in use has (a user's may have fewer)."""
        return [preset for size in self.defined_sizes() for preset in ladder_presets(size)]

    def claims(self, rows: Any) -> list[ClaimRow]:
        tidy = task_rows(rows, self.defined_presets())
        stored = {r["preset"] for r in tidy if r["task"] == "niah"}
        ladders, out = self.ladders(), []
        for preset in ladders:
            if stored & rung_lengths(preset).keys():
                out += claims(tidy, preset)
        unmeasured = [p for p in ladders if p.name in SIZES["cpu"]] or ladders[:1]
        return out or [c for p in unmeasured for c in claims([], p)]

    def report_sections(self, ctx: Context) -> list[Any]:
        rows = report_rows(ctx.tasks, self.defined_presets())
        blocks: list[Any] = [Heading(1, "Needle in a haystack ladder")]
        for preset in self.ladders():
            path = plot(rows, preset, ctx.out_dir / f"niah-{preset.name}.png")
            if path is None:
                continue
            ctx.plots.append(path)
            task = preset.task
            blocks.append(
                Image(path, f"NIAH {task.variant} accuracy against length, preset {preset.name}")
            )
            headers, body = table(rows, preset)
            caption = (
                "A cell: the mean accuracy over seeds (each the mean over the depth splits) "
                "and its 95% interval (Student's t, clipped to 0-100%). " + scale_text(preset)
            )
            blocks += narrow_tables(headers, body, key=2, caption=caption)
        if len(blocks) == 1:
            blocks.append(Para(f"No rows for this section; run `{self.command}` to fill it."))
        return blocks


__all__ = ["NeedleLadder"]
