"""Accuracy x cost and task results: task runs joined with the measured cost of the same model at
the task's length and batch, and each task's runs as the task tabulates them."""

from __future__ import annotations

from typing import Any

from ..measure.metrics import METRICS, metric_spec
from ..tasks.base import tabulation_of
from ..tasks.results import kept_by_latest_definition
from ..tasks.tabulate import natural_order
from .analysis import join_tasks_costs, pareto_front
from .context import Context, empty_section, opening, trusted
from .cost import header
from .document import Heading, Image, Para, Table, narrow_tables
from .ledger import FORMATS
from .plots import axis_label, pareto_plot

TASK_COMMAND = "zoo task NAME --preset cpu"  # NAME: a task of `zoo task --list`
COST_COMMAND = "zoo task NAME --preset cpu --cost"
TRAIN_STEP = "train-step"
NO_COST = (
    "No task run has a cost row of the same model configuration yet; run "
    f"`{COST_COMMAND}` to measure them."
)


def _steps_metric(metrics: dict[str, float]) -> str | None:
    return next((m for m in sorted(metrics) if m.startswith("steps_to_") and "@" not in m), None)


def _front_of_trusted(cost_rows: list[Any], cost: list[float], acc: list[float]) -> list[bool]:
    """The Pareto front among the points whose time may be ranked; a set-aside time is on none."""
    ok = [trusted(row, "time_median") for row in cost_rows]
    front = iter(
        pareto_front([c for c, t in zip(cost, ok) if t], [a for a, t in zip(acc, ok) if t])
    )
    return [next(front) if t else False for t in ok]


def accuracy_cost(ctx: Context) -> list[Any]:
    if ctx.tasks.empty:
        return empty_section("Accuracy x cost", TASK_COMMAND)
    tasks = _latest_runs(ctx.tasks.assign(task_row=range(len(ctx.tasks))))
    blocks = opening(
        "Accuracy x cost",
        (
            "Each trained model's accuracy (as trained, on the held-out test set) and steps to "
            "the target accuracy (on the evaluation set that stops training), "
            "beside the measured median time and peak memory of one training step of the same "
            "model configuration at the task's length and batch (bench target `model`, mode "
            "`train-step`). The Pareto front (no other variant both cheaper and more accurate) "
            "is marked; a time set aside (busy †, unstable ‡) is on no front."
        ),
    )
    bench = ctx.bench
    if bench.empty:  # a store of task runs only: no cost row to join
        return [*blocks, Para(NO_COST)]
    costs = bench[
        (bench["target"] == "model")
        & (bench["mode"] == TRAIN_STEP)
        & (bench["status"] == "ok")
        & (bench["model_key"] != "")
    ]
    columns = ["model_key", "seq_len", "batch", "run_id", "case_key", "metrics", "config"]
    cost_cols = costs[[*columns, "busy", "unstable"]]
    cost_cols = cost_cols.rename(
        columns={
            "seq_len": "length",
            "run_id": "cost_run",
            "case_key": "cost_case",
            "metrics": "cost_metrics",
            "config": "cost_config",
            "busy": "cost_busy",
            "unstable": "cost_unstable",
        }
    )
    joined = join_tasks_costs(tasks, cost_cols, on=("model_key", "length", "batch"))
    if joined.empty:
        return [*blocks, Para(NO_COST)]
    for (task, preset), part in sorted(joined.groupby(["task", "preset"]), key=_by_preset):
        part = part[
            [
                ("time_median" in m) and ("accuracy" in t)
                for m, t in zip(part["cost_metrics"], part["metrics"])
            ]
        ]
        if part.empty:
            continue
        cost = [m["time_median"] for m in part["cost_metrics"]]
        acc = [m["accuracy"] for m in part["metrics"]]
        cost_rows = [
            {"run_id": r["cost_run"], "case_key": r["cost_case"], "metrics": r["cost_metrics"]}
            | {"status": "ok", "busy": r["cost_busy"], "unstable": r["cost_unstable"]}
            for _, r in part.iterrows()
        ]
        front = _front_of_trusted(cost_rows, cost, acc)
        step_time = axis_label("time_median", "time per training step")
        points = part.assign(
            label=[f"{b} s{s}" for b, s in zip(part["backend"], part["seed"])],
            **{
                step_time: [c / METRICS["time_median"].scale for c in cost],
                "accuracy [%]": [a * 100 for a in acc],
            },
        )
        path = pareto_plot(
            points,
            front,
            step_time,
            "accuracy [%]",
            f"{task} / {preset}",
            ctx.out_dir / f"pareto-{task}-{preset}.png",
        )
        ctx.plots.append(path)
        rows = []
        for (_, r), on, cost_row in zip(part.iterrows(), front, cost_rows):
            steps = _steps_metric(r["metrics"])
            rows.append(
                [
                    f"`{r['backend']}`",
                    f"`seed={r['seed']}`",
                    ctx.metric(r, "accuracy", "fraction"),
                    ctx.metric(r, steps, "count") if steps else "-",
                    ctx.metric(cost_row, "time_median", mark_time=True),
                    ctx.metric(cost_row, "peak_bytes"),
                    "yes" if on else "",
                ]
            )
        blocks += [
            Heading(2, f"`{task}` / `{preset}`"),
            Image(path, f"accuracy against time per training step: {task} / {preset}"),
            Table(
                [
                    "trained with",
                    "seed",
                    "accuracy",
                    "steps to target",
                    header("time_median", "train step"),
                    header("peak_bytes", "peak memory"),
                    "Pareto front",
                ],
                rows,
            ),
        ]
    missing = sorted(set(tasks["task_row"]) - set(joined["task_row"]))
    if missing:
        names = sorted(
            {
                f"{r['task']}/{r['preset']} {r['backend']}"
                for _, r in tasks[tasks["task_row"].isin(missing)].iterrows()
            }
        )
        blocks.append(
            Para(
                "Without a cost row of the same model (run `"
                + COST_COMMAND
                + "`): "
                + ", ".join(f"`{n}`" for n in names)
            )
        )
    return blocks


def task_tables(ctx: Context) -> list[Any]:
    """Each stored task/preset as its task tabulates it (a train x eval matrix, a cell the mean
    over seeds through the ledger)."""
    title = "Task results"
    if ctx.tasks.empty:
        return empty_section(title, TASK_COMMAND)
    blocks = opening(
        title,
        (
            "Each task's stored runs as the task tabulates them: rows are the attention a model "
            "was trained with, columns the attention it was evaluated with (weights unchanged; "
            "`trained` = as trained, `full` = shared-QK full attention; every accuracy on the "
            "held-out test set, not the evaluation set that stopped training). One table per task, "
            "preset and length; a cell is the mean over the seeds its row names, at that length "
            "only."
        ),
    )
    groups = sorted(ctx.tasks.groupby(["task", "preset", "length"]), key=_by_preset)
    for (task, preset, length), part in groups:
        part, earlier = _latest_definition(part)
        tabulation = tabulation_of(task)
        cells = {
            cell: [ctx.input(r, metric) for metric, r in found]
            for cell, found in tabulation.cells(
                (r["backend"], r["metrics"], r) for _, r in part.iterrows()
            ).items()
        }
        trains, evals = tabulation.axes(cells)
        unit = metric_spec(tabulation.metric).unit
        kind = unit if unit in FORMATS else tabulation.metric  # how the ledger prints a cell
        rows = []
        for t in trains:
            seeds = sorted({int(c["seed"]) for k, v in cells.items() if k[0] == t for _, c, _ in v})
            line = [f"`{t}` (seeds `{','.join(map(str, seeds))}`)"]
            for e in evals:
                line.append(
                    ctx.ledger.derive(kind, "mean", cells[(t, e)])[1] if (t, e) in cells else "-"
                )
            rows.append(line)
        blocks += [
            Heading(2, f"`{task}` / preset `{preset}`, L {length}: {tabulation.metric}"),
            *narrow_tables(
                ["train \\ eval", *[f"`{e}`" for e in evals]],
                rows,
                caption=f"Mean over the seeds each row names, at length {length}."
                + (
                    f" {earlier} run(s) of an earlier definition of this preset (other task, "
                    "training or model fields, or scored on another set) left out; `rows.csv` "
                    "keeps them."
                    if earlier
                    else ""
                ),
            ),
        ]
    return blocks


def _by_preset(group: tuple[tuple, Any]) -> tuple:
    """A (task, preset, ...) group's order: presets by name with numbers read as numbers, so a
    ladder's rungs come shortest first (ladder-n32 before ladder-n128)."""
    (task, preset, *rest), _ = group
    return task, natural_order(preset), *rest


def _latest_runs(tasks: Any) -> Any:
    """The runs `task_tables` shows: each (task, preset, length)'s, each backend's as its latest
    stored definition trained them."""
    import pandas as pd

    parts = [_latest_definition(part)[0] for _, part in tasks.groupby(["task", "preset", "length"])]
    return pd.concat(parts) if parts else tasks


def _latest_definition(part: Any) -> tuple[Any, int]:
    """A preset's runs at one length, each backend's as its latest stored definition trained
    them and scored on the set the latest run was (`kept_by_latest_definition`), and how many
    runs of earlier definitions that leaves out."""
    ordered = part.sort_values("created_at", kind="stable")
    runs = [(0, b, c.get("spec") or {}) for b, c in zip(ordered["backend"], ordered["config"])]
    keep = kept_by_latest_definition(runs)
    return ordered[keep], keep.count(False)
