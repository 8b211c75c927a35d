"""Reproductions are registered units: `zoo reproduce --list` lists them, a module given with
--import adds a task and a reproduction that `zoo task --list`, `zoo reproduce --list` and the
report show with no other edit; the Reformer's published numbers are typed once."""

from __future__ import annotations

import inspect
import re
import sys
from fnmatch import fnmatch
from pathlib import Path

import pytest

from attention_zoo.cli import main
from attention_zoo.reproduce import REPRODUCTIONS, Reproduction, register_reproduction
from attention_zoo.reproduce.reformer.published import PUBLISHED, table2
from attention_zoo.store import ResultStore
from attention_zoo.tasks.results import KIND, save_trained

MODULE = "zoo_throwaway_reproduction"
SOURCE = '''
"""A throwaway task and a throwaway reproduction of it, from outside the package."""

import json
from dataclasses import dataclass

import torch

from attention_zoo.report.claims import FAILS, HOLDS, NOT_MEASURED, ClaimRow
from attention_zoo.report.document import Heading, Para
from attention_zoo.reproduce import Reproduction, TaskRun, register_reproduction
from attention_zoo.tasks import Batch, TaskConfig, TrainEvalMatrix, register_task


@register_task("throwaway-task")
@dataclass(frozen=True, kw_only=True)
class ThrowawayTask(TaskConfig):
    """Repeat the token (tabulated by its evaluation loss)."""

    tabulation = TrainEvalMatrix(metric="loss")

    def sample(self, batch_size, generator):
        ids = torch.randint(0, self.vocab_size, (batch_size, self.seq_len), generator=generator)
        return Batch(ids, ids.clone())

    def chance_accuracy(self):
        return 1 / self.vocab_size


@register_reproduction
class Throwaway(Reproduction):
    name, title = "throwaway", "The throwaway paper's claims"
    description = "a test reproduction"
    sources = ("Nobody et al. 2026, Table 9",)

    def task_runs(self, size):
        return (TaskRun(task="throwaway-task", preset=size),)

    def claims(self, rows):
        found = [
            (f"{r['run_id']}/{r['case_key']}", r["value"])
            for _, r in rows.iterrows()
            if r["metric"] == "accuracy" and json.loads(r["config"]).get("task") == "throwaway-task"
        ]
        if not found:
            return [ClaimRow(claim="x. it learns", setting="-", published="90%",
                             ours=f"run: {self.command}", rule="-", verdict=NOT_MEASURED)]
        ref, value = found[0]
        return [ClaimRow(claim="x. it learns", setting="preset tiny", published="90%",
                         ours=f"{100 * value:.0f}%", rule="holds: ours >= 90%",
                         verdict=HOLDS if value >= 0.9 else FAILS, rows_used=(ref,))]

    def report_sections(self, ctx):
        return [Heading(1, "Throwaway table"), Para("the reproduction's own section")]
'''


@pytest.fixture
def plugin(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    clean_registries: None,
) -> Path:
    (tmp_path / f"{MODULE}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_an_imported_task_and_reproduction_are_listed(
    plugin: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _run(capsys, "task", "--list", "--import", MODULE)
    assert "  throwaway-task: presets -" in out and "  duplication: presets" in out
    out = _run(capsys, "reproduce", "--list", "--import", MODULE)
    assert f"  throwaway: a test reproduction (sizes smoke, cpu, paper; --import {MODULE})" in out
    assert "source: Nobody et al. 2026, Table 9" in out and "  reformer: " in out


@pytest.mark.slow
def test_an_imported_task_and_reproduction_are_in_the_report(
    plugin: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Stored runs of the plugin's task are tabulated as the task declares (loss, train x eval);
    the reproduction's claims and its own section are in the report."""
    for backend, accuracy in (("full", 0.95), ("lsh", 0.5)):
        rows = [
            {"task": "throwaway-task", "preset": "tiny", "backend": backend, "length": 8}
            | {"seed": 0, "metric": metric, "value": value, "eval": "trained"}
            for metric, value in (("accuracy", accuracy), ("loss", 1 - accuracy))
        ]
        with ResultStore("zoo.sqlite") as store:
            run_id = store.start_run(kind=KIND)
            save_trained(store, run_id, {"backend": backend}, rows)
            store.finish_run(run_id)
    _run(capsys, "report", "--store", "zoo.sqlite", "--out", "report", "--import", MODULE)
    text = (plugin / "report" / "report.md").read_text()
    matrix = text.split("### `throwaway-task` / preset `tiny`, L 8: loss")[1].split("\n#")[0]
    assert "| `full` (seeds `0`) | 0.0500 |" in matrix and "| `lsh` (seeds `0`) | 0.500 |" in matrix
    claims = text.split("### The throwaway paper's claims")[1].split("\n#")[0]
    assert "**Verdict rule**: holds: ours >= 90%." in claims  # stated once, above its table
    assert "| x. it learns | preset tiny | 90% | 95% | holds |" in claims
    assert "# Throwaway table\n\nthe reproduction's own section" in text
    assert "## Table 2" not in text  # the Reformer's own section: only with its task's runs


SUITE = """
task = "throwaway-task"
[presets.smoke]
description = "a few steps of a tiny model"
task = { seq_len = 8, vocab_size = 4, eval_size = 16 }
model = { hidden_size = 16, num_attention_heads = 2, feed_forward_size = 32, num_hidden_layers = 1 }
grid = { backends = ["full"], seeds = [0] }
[presets.smoke.train]
max_steps = 5
eval_every = 5
batch_size = 4
learning_rate = 1e-3
target_accuracy = 0.9
"""


@pytest.mark.slow
def test_zoo_reproduce_runs_an_imported_reproduction_s_task_and_prints_its_claims(
    plugin: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`zoo reproduce NAME` trains the reproduction's task runs by calling the task engine (no
    second CLI), then prints its claims from the store."""
    (plugin / "tasks").mkdir()
    (plugin / "tasks" / "throwaway-task.toml").write_text(SUITE)
    argv = ["reproduce", "throwaway", "--preset", "smoke", "--store", "zoo.sqlite"]
    out = _run(capsys, *argv, "--no-progress", "--import", MODULE)
    assert "reproducing The throwaway paper's claims, size smoke, on cpu -> zoo.sqlite" in out
    assert "throwaway-task: zoo task throwaway-task --preset smoke --store zoo.sqlite" in out
    assert "[1/1] full seed 0:" in out
    assert "The throwaway paper's claims, reproduced" in out and "x. it learns" in out
    with ResultStore("zoo.sqlite", create=False) as store:
        assert {c["config"]["task"] for c in store.cases()} == {"throwaway-task"}


def test_a_reproduction_is_registered_once_by_name(clean_registries: None) -> None:
    class Twice(Reproduction):
        name = "reformer"

    with pytest.raises(Exception, match="reproduction 'reformer' is already registered"):
        register_reproduction(Twice)
    with pytest.raises(TypeError, match="must be a Reproduction subclass"):
        register_reproduction(dict)  # type: ignore[arg-type]
    assert type(REPRODUCTIONS.get("reformer")).__name__ == "Reformer"


def test_the_reformers_table2_is_typed_once_in_percent_and_derived_as_fractions() -> None:
    fractions = table2()
    assert list(fractions) == ["shared-qk", "lsh-4", "lsh-2", "lsh-1"]  # the paper's row order
    assert fractions["shared-qk"]["lsh-8"] == pytest.approx(0.948)
    assert fractions["lsh-1"]["full"] == pytest.approx(
        PUBLISHED["f"]["accuracy"]["lsh-1"]["full"] / 100
    )


def test_zoo_reproduce_refuses_what_it_cannot_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reproduce", "reformr"]) == 2
    err = capsys.readouterr().err
    assert "unknown reproduction 'reformr'; known reproductions: " in err and "reformer" in err
    assert main(["reproduce", "reformer", "--list"]) == 2
    assert "--list takes no NAME" in capsys.readouterr().err
    assert main(["reproduce"]) == 2
    assert "zoo reproduce --list lists them" in capsys.readouterr().err
    assert "reformer" in sys.modules["attention_zoo.reproduce"].REPRODUCTIONS.names()


def test_every_plot_a_reproduction_writes_is_declared() -> None:
    """A rebuilt report removes a plot its build no longer writes only where a pattern names it
    (Reproduction.plots): each `out_dir / f"....png"` in a reproduction's package matches one."""
    for name in REPRODUCTIONS.names():
        repro = REPRODUCTIONS.get(name)
        package = Path(inspect.getfile(type(repro))).parent
        written = [
            re.sub(r"\{[^}]*\}", "x", found)
            for path in package.glob("*.py")
            for found in re.findall(r'out_dir / f"([^"]+\.png)"', path.read_text())
        ]
        assert all(any(fnmatch(w, p) for p in repro.plots) for w in written), (name, written)
