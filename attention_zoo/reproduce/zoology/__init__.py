"""Zoology's MQAR sweep (Arora, Eyuboglu et al. 2023, Figure 2) on the associative-recall task:
the sweep, its claims and its plot (sweep.py)."""

from __future__ import annotations

import logging
from typing import Any

from ...report.claims import ClaimRow
from ...report.context import Context
from ...report.document import Heading, Image, Para, narrow_tables
from ...tasks.suite import TaskPreset
from ..base import GPU_SIZE, PRESETS, register_reproduction
from ..evidence import cell_text
from ..training import TaskReproduction, report_rows, task_rows
from .sweep import (
    SOURCE,
    SWEEPS,
    accuracy_rows,
    claims,
    plot,
    stored_names,
    sweep_presets,
    width_label,
)

log = logging.getLogger(__name__)


@register_reproduction
class Zoology(TaskReproduction):
    """Which mechanisms solve MQAR at which model width (Zoology's Figure 2 layout)."""

    name = "zoology"
    title = "Zoology's MQAR sweep (Figure 2)"
    description = "MQAR accuracy against model width, causal backends, seeds and learning rates"
    sources = (SOURCE,)
    sizes = PRESETS
    gpu_sizes = (GPU_SIZE, "paper")
    plots = ("zoology-*.png",)

    def announce(self, size: str, device: str, store: str) -> list[str]:
        sweep = SWEEPS[size]
        base = sweep_presets(size)[0]
        points = ", ".join(f"L {n} / {kv} pairs" for n, kv in sweep.points)
        widths = ", ".join(map(width_label, sweep.widths))
        rates = ", ".join(f"{lr:g}" for lr in sweep.learning_rates)
        return [
            f"reproducing {self.title}, size {size}, on {device} -> {store}",
            f"sweep: {points}; widths {widths}; learning rates {rates}; backends "
            f"{', '.join(base.grid.backends)}; seeds {','.join(map(str, base.grid.seeds))}",
        ]

    def trained_presets(self, size: str) -> list[TaskPreset]:
        return sweep_presets(size)

    def claims(self, rows: Any) -> list[ClaimRow]:
        tidy = task_rows(rows, self.defined_presets())
        out = []
        for size in self.defined_sizes():
            if any(r["preset"] in _names(size) for r in tidy):
                target = sweep_presets(size)[0].train.target_accuracy
                out += claims(tidy, size, target)
        return out or claims([], "cpu", sweep_presets("cpu")[0].train.target_accuracy)

    def report_sections(self, ctx: Context) -> list[Any]:
        rows = report_rows(ctx.tasks, self.defined_presets())
        blocks: list[Any] = [Heading(1, "Zoology MQAR sweep")]
        for size in SWEEPS:
            path = plot(rows, size, ctx.out_dir / f"zoology-{size}.png")
            if path is None:
                continue
            ctx.plots.append(path)
            blocks.append(Image(path, f"MQAR accuracy against model width, preset {size}"))
            sweep = SWEEPS[size]
            table = [
                [f"`{backend}`", str(length)]
                + [
                    "-"
                    if cell is None
                    else ctx.ledger.claims(cell_text(cell[0]), " ".join(cell[1]))
                    for cell in cells
                ]
                for backend, length, cells in accuracy_rows(rows, size)
            ]
            rates = ", ".join(f"{lr:g}" for lr in sweep.learning_rates)
            caption = (
                "A cell: the mean final accuracy over the seeds it names and its 95% interval "
                "(Student's t, clipped to 0-100%); each seed's accuracy is that of its best "
                f"learning rate of {rates} (chosen on the evaluation set, scored on the "
                "held-out test set)."
            )
            headers = ["mechanism", "L", *map(width_label, sweep.widths)]
            blocks += narrow_tables(headers, table, key=2, caption=caption)
        if len(blocks) == 1:
            blocks.append(Para(f"No rows for this section; run `{self.command}` to fill it."))
        return blocks


def _names(size: str) -> set[str]:
    return set(stored_names(size))


__all__ = ["Zoology"]
