"""The Reformer's Table 2 in the report: our duplication-task matrix beside the paper's, as
heatmaps per preset, and the published table (the measured matrix itself is the report's task
section: the task tabulates it)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from ...report.context import Context
from ...report.document import Heading, Image, Para, Table
from ...report.plots import heatmaps
from ...tasks.base import tabulation_of
from ...tasks.suite import TaskPreset
from ..stored import as_defined
from .claims import TASK
from .published import TABLE2_CITATION, table2

HEATMAP_CAPTION = (
    "Look at the diagonal (trained and evaluated alike) and along each row (more evaluation "
    "hashes): the left panel is measured here, the right one published."
)


def _published_axes() -> tuple[list[str], list[str]]:
    published = table2()
    return list(published), list(next(iter(published.values())))


def table2_section(ctx: Context, presets: Sequence[TaskPreset] = ()) -> list[Any]:
    """Heading 'Table 2': heatmaps of each stored preset against the paper, then the paper's
    numbers through the ledger (cited); nothing without stored duplication runs (the Claims
    section names the command that trains them)."""
    title = "Table 2"
    tasks = ctx.tasks
    if not tasks.empty:  # the duplication runs of `presets` as each is defined now
        tasks = tasks[[as_defined(c, presets) for c in tasks["config"]]]
    if tasks.empty or not (tasks["task"] == TASK).any():
        return []
    import pandas as pd

    trains, evals = _published_axes()
    published = table2()
    tabulation = tabulation_of(TASK)
    blocks: list[Any] = [
        Heading(1, title),
        Para(
            "The duplication task's matrix (section Task results) beside the paper's: rows are "
            "the attention a model was trained with, columns the attention it was evaluated "
            "with; `full` = shared-QK full attention, the paper's 'Full attention'. "
            f"Published: `{TABLE2_CITATION}` (its sequence length and model size differ from a "
            "CPU preset's; compare the pattern, not the cells)."
        ),
    ]
    for preset, part in tasks[tasks["task"] == TASK].groupby("preset", sort=True):
        cells = tabulation.cells((r["backend"], r["metrics"], r) for _, r in part.iterrows())
        means = {
            cell: statistics.fmean(r["metrics"][metric] for metric, r in found)
            for cell, found in cells.items()
        }
        ours = pd.DataFrame(
            [[means.get((t, e), float("nan")) for e in evals] for t in trains],
            index=trains,
            columns=evals,
        )
        paper = pd.DataFrame(
            [[published[t][e] for e in evals] for t in trains], index=trains, columns=evals
        )
        path = heatmaps(ours, paper, ctx.out_dir / f"table2-{preset}.png")
        ctx.plots.append(path)
        blocks.append(
            Image(path, f"Table 2 heatmaps, preset {preset} and the paper", HEATMAP_CAPTION)
        )
    blocks += [
        Heading(2, "published"),
        Table(
            ["train \\ eval", *[f"`{e}`" for e in evals]],
            [
                [f"`{t}`"]
                + [
                    ctx.ledger.published("fraction", published[t][e], f"TABLE2[{t},{e}]")
                    for e in evals
                ]
                for t in trains
            ],
        ),
    ]
    return blocks
