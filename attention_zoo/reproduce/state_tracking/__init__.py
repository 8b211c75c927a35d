"""Grazzi et al. 2025's parity claims (state tracking): gated-deltanet with and without negative
eigenvalues, gla and linear attention, trained short and tested long, without position
embeddings (presets.py); the claims (claims.py) and the accuracy per length range (table, plot)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ...report.claims import ClaimRow
from ...report.context import Context
from ...report.document import Heading, Image, Para, narrow_tables
from ...report.plots import figure, save_figure
from ...tasks.suite import TaskPreset, load_task_preset
from ..base import GPU_SIZE, register_reproduction
from ..evidence import cell_text, error_bar
from ..training import TaskReproduction, report_rows, task_rows
from . import claims as parity
from .claims import FLOOR, MECHANISMS, SOURCE, accuracies, ranges
from .presets import TASK, base_name, negative_name, parity_presets, scale_text

SIZES = ("smoke", "cpu", GPU_SIZE)


@register_reproduction
class StateTracking(TaskReproduction):
    """Which linear recurrences learn parity and keep it past their training length."""

    name = "state-tracking"
    gpu_sizes = (GPU_SIZE,)
    title = "State tracking: parity with negative eigenvalues (Grazzi et al. 2025)"
    description = (
        "parity trained short, tested long: gated-deltanet with and without negative "
        "eigenvalues, gla, linear"
    )
    sources = (SOURCE,)
    sizes = SIZES
    plots = ("state-tracking-*.png",)

    def announce(self, size: str, device: str, store: str) -> list[str]:
        negative, base = parity_presets(size)
        return [
            f"reproducing {self.title}, size {size}, on {device} -> {store}",
            f"{scale_text(base)}; backends {', '.join(base.grid.backends)} and "
            f"{', '.join(negative.grid.backends)} with negative eigenvalues; seeds "
            + ",".join(map(str, base.grid.seeds)),
        ]

    def trained_presets(self, size: str) -> list[TaskPreset]:
        return parity_presets(size)

    def claims(self, rows: Any) -> list[ClaimRow]:
        tidy = task_rows(rows, self.defined_presets())
        found = [z for z in self.defined_sizes() if any(r["preset"] in _names(z) for r in tidy)]
        found = found or ["cpu"]
        return [
            c for z in found for c in parity.claims(tidy, z, load_task_preset(TASK, base_name(z)))
        ]

    def report_sections(self, ctx: Context) -> list[Any]:
        rows = report_rows(ctx.tasks, self.defined_presets())
        blocks: list[Any] = [Heading(1, "State tracking: parity past the training length")]
        for size in self.defined_sizes():
            if not any(r["preset"] in _names(size) for r in rows):
                continue
            preset = load_task_preset(TASK, base_name(size))
            spans = ranges(preset)
            table = []
            for m in MECHANISMS:
                cells, used = accuracies(rows, size, m, [k for k, _ in spans])
                if cells:
                    table.append(
                        [f"`{m.name}`"]
                        + [
                            ctx.ledger.claims(cell_text(cells[k], scale=1), " ".join(used))
                            if k in cells
                            else "-"
                            for k, _ in spans
                        ]
                    )
            path = plot(rows, size, ctx.out_dir / f"state-tracking-{size}.png")
            if path is not None:
                ctx.plots.append(path)
                blocks.append(Image(path, f"Parity accuracy per length range, preset {size}"))
            caption = (
                f"Preset {size}: {scale_text(preset)}. A cell: the mean accuracy over the seeds "
                f"it names and its 95% interval (Student's t, clipped to 0-100%), over the "
                f"positions of the range; the first column is the training length. Chance 50%, "
                f"the claims' floor {FLOOR:g}%."
            )
            headers = ["mechanism", *(f"positions {text}" for _, text in spans)]
            blocks += narrow_tables(headers, table, caption=caption)
        if len(blocks) == 1:
            blocks.append(Para(f"No rows for this section; run `{self.command}` to fill it."))
        return blocks


def plot(rows: Iterable[Mapping[str, Any]], size: str, path: Path) -> Path | None:
    """Accuracy against length range, a line per mechanism (the mean over seeds, bars the 95%
    interval where there are enough seeds); chance and the floor marked."""
    rows = list(rows)
    preset = load_task_preset(TASK, base_name(size))
    spans = ranges(preset)
    lines = {m.name: accuracies(rows, size, m, [k for k, _ in spans])[0] for m in MECHANISMS}
    if not any(lines.values()):
        return None
    with figure(figsize=(6.5, 3.6)) as (fig, ax):
        xs = range(len(spans))
        for name, cells in lines.items():
            points = [(x, cells[k]) for x, (k, _) in zip(xs, spans) if cells.get(k)]
            if not points:
                continue
            means, errs = zip(*(error_bar(s) for _, s in points))
            ax.errorbar([x for x, _ in points], means, yerr=errs, marker="o", capsize=3, label=name)
        ax.axhline(50, color="grey", linestyle=":", label="chance")
        ax.axhline(FLOOR, color="grey", linestyle="--", linewidth=0.8, label=f"floor {FLOOR:g}%")
        ax.set_xticks(list(xs), [f"{text}{' (train)' if i == 0 else ''}" for i, (_, text) in
                                 enumerate(spans)])  # fmt: skip
        ax.set_xlabel("scored positions")
        ax.set_ylabel("parity accuracy [%] (mean over seeds)")
        ax.set_ylim(0, 105)
        ax.legend(fontsize=7, loc="lower left")
        ax.set_title(f"Parity past the training length, preset {size}", fontsize=10)
        path.parent.mkdir(parents=True, exist_ok=True)
        return save_figure(fig, path)


def _names(size: str) -> set[str]:
    return {base_name(size), negative_name(size)}


__all__ = ["StateTracking"]
