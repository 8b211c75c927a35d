"""Accuracy against length on the needle-in-a-haystack ladder: one line per mechanism (the mean over
seeds and depths, bars the 95% interval where there are enough seeds), chance marked."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ...report.plots import figure, save_figure
from ...tasks.suite import TaskPreset
from ..evidence import error_bar
from .ladder import REFERENCE, accuracies, memory

# a line's style by how the mechanism's state grows (ladder.Memory.kind)
LINES = {"fixed state": "--", "growing cache": "-", "state not sized here": ":"}


def plot(rows: Iterable[Mapping[str, Any]], preset: TaskPreset, path: Path) -> Path | None:
    """Write the preset's plot to `path`; None when no row of the preset is stored."""
    accs, _ = accuracies(rows, preset)
    if not accs:
        return None
    with figure(figsize=(6.5, 3.8)) as (fig, ax):
        for backend in sorted(accs, key=lambda b: (b != REFERENCE, b)):
            xs, ys, errs = [], [], []
            for length, seeds in sorted(accs[backend].items()):
                mean, err = error_bar(seeds)
                xs.append(length)
                ys.append(mean)
                errs.append(err)
            state = memory(preset, backend)
            ax.errorbar(
                xs, ys, yerr=errs, marker="o", capsize=3, linestyle=LINES[state.kind],
                linewidth=2.5 if backend == REFERENCE else 1.2, label=f"{backend} ({state.kind})",
            )  # fmt: skip
        chance = 100 * preset.task.chance_accuracy()
        ax.axhline(chance, color="grey", linestyle=":", label=f"chance ({chance:.1f}%)")
        lengths = list(preset.task.lengths)
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.set_xlabel("sequence length (tokens)")
        ax.set_ylabel("accuracy on the needles' values (%)")
        ax.set_ylim(0, 105)
        ax.legend(fontsize=7, loc="lower left")
        task = preset.task
        ax.set_title(
            f"NIAH {task.variant}, {task.haystack} haystack: accuracy vs length, "
            f"preset {preset.name}",
            fontsize=9,
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        return save_figure(fig, path)
