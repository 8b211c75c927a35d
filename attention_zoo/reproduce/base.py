"""What a reproduction is, and the registry `zoo reproduce` and the report read.

A reproduction (one paper, one folder under attention_zoo/reproduce/) subclasses `Reproduction`
and registers itself with `@register_reproduction`; a plugin (`--import MODULE`) does the same.
It owns its experiments (`run`: benchmark sweeps into the store; `task_runs`: task suite presets
that `zoo reproduce` trains), its published numbers with their sources, its verdict rules
(`claims(rows) -> list[ClaimRow]`, read from stored rows) and any table of its own in the report
(`report_sections(ctx)`). Nothing outside its folder names it.

    @register_reproduction
    class Mine(Reproduction):
        name, title = "mine", "Mine's claims"
        description = "one line for zoo reproduce --list"
        sources = ("Author et al. 2024, Table 1",)

        def task_runs(self, size):
            return (TaskRun(task="my-task", preset=size),)

        def claims(self, rows):
            return [ClaimRow(claim=..., setting=..., published=..., ours=..., rule=...,
                             verdict=HOLDS, rows_used=(...))]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from ..engine import RunPolicy
from ..errors import UnknownPresetError
from ..executors import Executor
from ..measure.table import format_table
from ..registry import Registry
from ..report.claims import CLAIM_COLUMNS, ClaimRow
from ..report.context import Context
from ..store import ResultStore
from ..sweep import SweepResult
from ..tasks.suite import TaskPreset, load_task_preset

SIZES = ("smoke", "cpu", "paper")  # toy pipeline check, minutes on a CPU, the published settings
GPU_SIZE = "gpu"  # minutes on one GPU: a size the task reproductions add (Reproduction.sizes)
PRESETS = ("smoke", "cpu", GPU_SIZE, "paper")  # every size a reproduction may declare
OWN_SETTINGS = "preset"  # attention options as the preset scales them to its lengths


@dataclass(frozen=True, kw_only=True)
class TaskRun:
    """A task suite preset a reproduction trains (as `zoo task TASK --preset PRESET`)."""

    task: str
    preset: str
    title: str = ""  # what it reproduces, printed before it runs, e.g. "Table 2 (claim f)"
    optional: bool = False  # long: trained only when asked (zoo reproduce --with-tasks)


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """How `Reproduction.run` measures: where, with how many threads, resuming or not."""

    device: str = "cpu"
    threads: int | None = None
    policy: RunPolicy = field(default_factory=lambda: RunPolicy(resume=True))  # resumes by default
    progress: bool = True
    meta: dict[str, Any] = field(default_factory=dict)  # recorded with every run
    executor: Executor | None = None
    settings: str = OWN_SETTINGS  # whose attention options (Reproduction.settings)

    @property
    def task_policy(self) -> RunPolicy:
        """The policy of task trainings: --force carries over, and so does resuming (the latest run
        of the same trainings is continued: an interrupted one gets finished); --run-id names the
        benchmark run (a run holds one kind of job); a stored training is reused (RUN_RULE)."""
        return RunPolicy(
            force=self.policy.force, dry_run=self.policy.dry_run, resume=self.policy.resume
        )


class Reproduction:
    """One paper's reproduction: override what it has (a subclass needs a name, a title and
    `claims`; the rest defaults to nothing)."""

    name: str = ""  # zoo reproduce NAME
    title: str = ""  # heading of its claims, e.g. "The Reformer's claims"
    description: str = ""  # one line for --list
    sources: tuple[str, ...] = ()  # where its published numbers come from
    sizes: tuple[str, ...] = SIZES  # the sizes it runs at (--preset smoke, --scale cpu|paper)
    gpu_sizes: tuple[str, ...] = ()  # the sizes measured on CUDA when there is a GPU
    settings: tuple[str, ...] = (OWN_SETTINGS,)  # whose attention options it can train with
    plots: tuple[str, ...] = ()  # file patterns of the plots `report_sections` writes

    @property
    def command(self) -> str:
        return f"zoo reproduce {self.name}"

    def device(self, size: str) -> str:
        """Where `size` is measured: CUDA for the sizes in `gpu_sizes` when there is a GPU, else
        the CPU."""
        return "cuda" if size in self.gpu_sizes and torch.cuda.is_available() else "cpu"

    def announce(self, size: str, device: str, store: str) -> list[str]:
        """The lines printed before anything runs."""
        return [f"reproducing {self.title}, size {size}, on {device} -> {store}"]

    def run(self, size: str, store: ResultStore, options: RunOptions) -> list[SweepResult]:
        """Measure the benchmark experiments of `size` into `store` (resumable sweeps)."""
        return []

    def trained_presets(self, size: str) -> list[TaskPreset]:
        """The task presets `run` trains at `size` itself (through `train_presets`)."""
        return []

    def presets_of(self, size: str) -> list[TaskPreset] | None:
        """The task presets of `size` (`trained_presets` and `task_runs`) as the suites in use
        define them now; None where a suite lacks one (a user's edited suite may)."""
        try:
            tasks = [load_task_preset(r.task, r.preset) for r in self.task_runs(size)]
            return [*self.trained_presets(size), *tasks]
        except UnknownPresetError:
            return None

    def defined_sizes(self) -> list[str]:
        """The sizes whose presets the suites in use define: those `claims` and
        `report_sections` can state a scale for."""
        return [size for size in self.sizes if self.presets_of(size) is not None]

    def defined_presets(self) -> list[TaskPreset]:
        """The presets of every defined size: `claims` and `report_sections` read a stored run of
        one only where it agrees with its definition now (stored.as_defined)."""
        return [p for size in self.sizes for p in self.presets_of(size) or []]

    def task_runs(self, size: str) -> tuple[TaskRun, ...]:
        """The task suite presets trained at `size`, after `run`."""
        return ()

    def claims(self, rows: Any) -> list[ClaimRow]:
        """One row per claim and setting from stored rows (`ResultStore.to_dataframe()`); a claim
        without rows is NOT_MEASURED and says which command measures it."""
        raise NotImplementedError

    def report_sections(self, ctx: Context) -> list[Any]:
        """Report blocks of its own beside the generic sections (e.g. a paper's table)."""
        return []


R = TypeVar("R", bound=Reproduction)
REPRODUCTIONS: Registry[Reproduction] = Registry("reproduction")


def register_reproduction(
    cls: type[R] | None = None, *, replace: bool = False
) -> type[R] | Callable[[type[R]], type[R]]:
    """Class decorator: register one instance of a Reproduction subclass under its `name`
    (`@register_reproduction` or `@register_reproduction(replace=True)`)."""

    def wrap(cls: type[R]) -> type[R]:
        if not (isinstance(cls, type) and issubclass(cls, Reproduction)):
            raise TypeError(f"a reproduction must be a Reproduction subclass, got {cls!r}")
        REPRODUCTIONS.add(cls.name, cls(), replace=replace)
        return cls

    return wrap if cls is None else wrap(cls)


def get_reproduction(name: str) -> Reproduction:
    return REPRODUCTIONS.get(name)


def render_claims(reproduction: Reproduction, rows: Any) -> str:
    """The claims of `reproduction` as plain text, the verdict rules and scales numbered below
    the table."""
    claims = reproduction.claims(rows)
    rules = list(dict.fromkeys(c.rule for c in claims if c.rule != "-"))
    scales = list(dict.fromkeys(c.scale for c in claims if c.scale != "-"))
    body = [
        [
            c.claim,
            c.setting,
            f"[s{scales.index(c.scale) + 1}]" if c.scale in scales else "-",
            c.published,
            c.ours,
            c.interval,
            c.floor,
            c.seeds,
            c.verdict,
            f"[{rules.index(c.rule) + 1}]" if c.rule in rules else "-",
        ]
        for c in claims
    ]
    headers = ["claim", "setting", "scale", "published", "ours", "interval", "floor", "seeds"]
    text = format_table([*headers, "verdict", "rule"], body)
    return (
        f"\n{reproduction.title}, reproduced\n"
        + text
        + "\n\nrules:\n"
        + "\n".join(f"  [{i}] {rule}" for i, rule in enumerate(rules, 1))
        + ("\nscales:\n" if scales else "")
        + "\n".join(f"  [s{i}] {scale}" for i, scale in enumerate(scales, 1))
    )


def claims_frame(claims: list[ClaimRow]) -> Any:
    """Claims as a DataFrame with CLAIM_COLUMNS (for tests and notebooks)."""
    import pandas as pd

    return pd.DataFrame([c.cells() for c in claims], columns=list(CLAIM_COLUMNS))


def list_reproductions() -> str:
    """`zoo reproduce --list`: every registered reproduction, its sizes, sources and origin."""
    lines = [f"reproductions (zoo reproduce NAME [--preset {'|'.join(PRESETS)}]):"]
    for name in REPRODUCTIONS.names():
        r = REPRODUCTIONS.get(name)
        settings = f"; settings {', '.join(r.settings)}" if len(r.settings) > 1 else ""
        lines.append(
            f"  {name}: {r.description} (sizes {', '.join(r.sizes)}{settings}; "
            f"{REPRODUCTIONS.origin(name)})"
        )
        lines += [f"      source: {s}" for s in r.sources]
    return "\n".join(lines)
