"""The Mamba paper's selective copying (Gu & Dao 2023, Table 1): a data-dependent decay (`gla`), a
fixed one (`retention`) and softmax attention trained on the task (the suite's preset of the
size), judged by Table 1's ordering (table1.py)."""

from __future__ import annotations

from typing import Any

from ...report.claims import ClaimRow
from ...report.context import Context
from ...report.document import Heading, Para, narrow_tables
from ...tasks.suite import TaskPreset, load_task_preset
from ..base import GPU_SIZE, PRESETS, register_reproduction
from ..evidence import (
    cell_text,  # a cell of seeds: mean, interval, seed count
    per_seed,
)
from ..training import TaskReproduction, model_and_budget, report_rows, task_rows
from . import table1
from .table1 import REFERENCE, SOURCE, TABLE1, TASK


def scale_text(preset: TaskPreset) -> str:
    """The size a claim was measured at, in one line (the paper's beside it)."""
    task = preset.task
    return (
        f"L {task.seq_len}, {task.num_tokens} tokens to copy, V {task.vocab_size}; "
        f"{model_and_budget(preset)}; {task.eval_size} evaluation sequences (Table 1: L 4096, "
        "16 tokens, V 16)"
    )


@register_reproduction
class MambaSelectiveCopying(TaskReproduction):
    """Table 1's ordering of selection (S6) over a fixed decay (S4), on our mapped backends."""

    name = "selective-copying"
    gpu_sizes = (GPU_SIZE, "paper")
    title = "Mamba's selective copying (Table 1)"
    description = "selective copying: a data-dependent decay vs a fixed one, beside Table 1"
    sources = (SOURCE,)
    sizes = PRESETS

    def announce(self, size: str, device: str, store: str) -> list[str]:
        preset = load_task_preset(TASK, size)
        return [
            f"reproducing {self.title}, size {size}, on {device} -> {store}",
            f"{TASK} / preset {size}: {scale_text(preset)}; backends "
            f"{', '.join(preset.grid.backends)}; seeds {','.join(map(str, preset.grid.seeds))}",
        ]

    def trained_presets(self, size: str) -> list[TaskPreset]:
        return [load_task_preset(TASK, size)]

    def claims(self, rows: Any) -> list[ClaimRow]:
        tidy = [r for r in task_rows(rows, self.defined_presets()) if r["task"] == TASK]
        found = [s for s in self.defined_sizes() if any(r["preset"] == s for r in tidy)] or ["cpu"]
        return [
            line
            for size in found
            for line in table1.claims(tidy, size, scale_text(load_task_preset(TASK, size)))
        ]

    def report_sections(self, ctx: Context) -> list[Any]:
        rows = [r for r in report_rows(ctx.tasks, self.defined_presets()) if r["task"] == TASK]
        blocks: list[Any] = [Heading(1, "Selective copying (Mamba Table 1)")]
        sizes = [s for s in self.defined_sizes() if any(r["preset"] == s for r in rows)]
        if not sizes:
            return [*blocks, Para(f"No rows for this section; run `{self.command}` to fill it.")]
        body = []
        for row in TABLE1:
            cells = [row.model, row.arch, row.layer, f"{row.accuracy:.1f}"]
            cells.append(f"`{row.backend}`: {row.mapping}" if row.backend else row.mapping)
            body.append(cells + [_cell(ctx, rows, row.backend, s) for s in sizes])
        ours = sorted({r["backend"] for r in rows} - {r.backend for r in TABLE1})
        for backend in sorted(ours, key=lambda b: b != REFERENCE):
            note = "softmax attention: the reference" if backend == REFERENCE else "no row"
            body.append(["-", "-", "-", "-", f"`{backend}`: {note}"]
                        + [_cell(ctx, rows, backend, s) for s in sizes])  # fmt: skip
        caption = (
            f"Published: {SOURCE}. Ours: the mean final accuracy over the seeds and its 95% "
            "interval (Student's t, clipped to 0-100%), per preset: "
            + "; ".join(f"{s}: {scale_text(load_task_preset(TASK, s))}" for s in sizes)
            + ". The mapping is by the inner layer and approximate (see each row)."
        )
        headers = ["Model", "Arch.", "Layer", "Acc. [%]", "our backend", *sizes]
        return [*blocks, *narrow_tables(headers, body, key=5, caption=caption)]


def _cell(ctx: Context, rows: list[dict[str, Any]], backend: str | None, size: str) -> str:
    """The mean accuracy of `backend` at preset `size` over seeds, with its interval; '-' without
    runs."""
    if backend is None:
        return "-"
    seeds, refs = per_seed([r for r in rows if r["preset"] == size], backend=backend)
    return ctx.ledger.claims(cell_text(seeds), " ".join(refs)) if seeds else "-"


__all__ = ["MambaSelectiveCopying"]
