"""Task suites (TOML presets), grid planning, results in the store, Table 2 pivot, `zoo task`."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from attention_zoo.cli import main
from attention_zoo.config import ReformerConfig
from attention_zoo.errors import ConfigError, UnknownNameError
from attention_zoo.store import ResultStore, case_key
from attention_zoo.tasks.results import KIND, SCORED_ON, case_config, load_rows, save_trained
from attention_zoo.tasks.runner import eval_variants, plan_runs, train_variants
from attention_zoo.tasks.suite import REQUIRED, find_suite, load_task_preset
from attention_zoo.tasks.tabulate import build_matrix, format_matrix

SUITE = """
task = "duplication"
[defaults.model]
num_hidden_layers = 1
axial_pos_embds = false
hidden_dropout_prob = 0.0
residual = "standard"
[defaults.grid]
seeds = [0]
[presets.tiny]
task = { seq_len = 16, vocab_size = 6, eval_size = 32 }
model = { hidden_size = 32, num_attention_heads = 2, feed_forward_size = 32 }
train = { max_steps = 4, eval_every = 2, target_accuracy = 0.95, warmup_steps = 2 }
grid = { backends = ["shared-qk"], eval_hashes = [] }
[presets.broken]
task = { vocab_size = 6 }
model = { hidden_size = 32 }
train = { eval_every = 2 }
grid = { seeds = [0] }
"""


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    path = tmp_path / "dup.toml"
    path.write_text(SUITE)
    return path


def test_shipped_suites_load_every_preset() -> None:
    for task in ("duplication", "associative-recall"):
        for name in ("smoke", "cpu", "paper"):
            preset = load_task_preset(task, name)
            assert preset.task.name == task and preset.train.max_steps >= 1
            assert preset.description
    cpu = load_task_preset("duplication", "cpu")  # the calibrated preset
    assert (cpu.task.seq_len, cpu.task.vocab_size) == (128, 32)
    assert cpu.model["hidden_size"] == 128 and cpu.model["lsh_attn_chunk_length"] == 4
    assert cpu.model["num_buckets"] == 32 and cpu.train.batch_size == 32


def test_preset_missing_fields_are_all_named(suite: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_task_preset(str(suite), "broken")
    text = str(err.value)
    for field in (
        "task.seq_len",
        "model.num_attention_heads",
        "model.feed_forward_size",
        "train.max_steps",
        "train.target_accuracy",
        "grid.backends",
    ):
        assert field in text, text
    assert "model.hidden_size" not in text  # given
    assert "model.num_hidden_layers" not in text  # from [defaults]
    assert set(REQUIRED) == {"task", "model", "train", "grid"}


def test_unknown_task_and_preset(suite: Path) -> None:
    with pytest.raises(
        UnknownNameError, match="unknown task 'dedup'; known tasks: associative-recall, duplication"
    ):
        find_suite("dedup")
    with pytest.raises(ConfigError, match="no preset 'gpu'; presets: tiny, broken"):
        load_task_preset(str(suite), "gpu")


def test_a_folder_named_like_a_task_does_not_hide_its_suite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`zoo task niah` run where a folder `niah/` exists still finds niah's suite."""
    (tmp_path / "niah").mkdir()
    monkeypatch.chdir(tmp_path)
    assert load_task_preset("niah", "ladder-smoke").task.name == "niah"


def test_bad_fields_say_what_is_accepted(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(SUITE.replace("max_steps = 4", "max_steps = 4, lr = 0.1"))
    with pytest.raises(
        ConfigError,
        match=r"train does not take field\(s\) 'lr'; it takes: batch_size, learning_rate",
    ):
        load_task_preset(str(bad), "tiny")
    bad.write_text(SUITE.replace("hidden_size = 32,", "hidden_size = 32, attn_layers = ['lsh'],"))
    with pytest.raises(ConfigError, match=re.escape("model.attn_layers are set by the engine")):
        load_task_preset(str(bad), "tiny")


@pytest.mark.parametrize(
    ("seq_len", "message"),
    [
        ('"16"', "duplication: seq_len must be an integer >= 2, got '16'"),
        ("99999999999999", "seq_len must be an integer from 2 to 2147483647 (2**31 - 1)"),
    ],
)
def test_a_task_length_of_the_wrong_kind_is_refused_in_one_line(
    tmp_path: Path, seq_len: str, message: str
) -> None:
    """Before: a string compared with an int (TypeError); a length past the kernels' int32."""
    bad = tmp_path / "bad.toml"
    bad.write_text(SUITE.replace("seq_len = 16", f"seq_len = {seq_len}"))
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_task_preset(str(bad), "tiny")


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("max_steps = 4", 'max_steps = "4"', "train: max_steps must be an int, got '4'"),
        ("max_steps = 4", "max_steps = 4.5", "train: max_steps must be an int, got 4.5"),
        ("seeds = [0]", "seeds = [0.5]", "grid: seeds must be a list of ints, got (0.5,)"),
        ("eval_hashes = []", "eval_full = 1", "grid: eval_full must be true or false, got 1"),
    ],
)
def test_train_and_grid_values_of_the_wrong_kind_are_refused_in_one_line(
    tmp_path: Path, old: str, new: str, message: str
) -> None:
    """Before: a string step count compared with an int (TypeError); 4.5 steps passed."""
    bad = tmp_path / "bad.toml"
    bad.write_text(SUITE.replace(old, new, 1))
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_task_preset(str(bad), "tiny")


def test_grid_expansion_and_eval_overrides() -> None:
    labels = [v.label for v in train_variants(["shared-qk", "lsh", "local+lsh", "full"], [4, 1])]
    assert labels == ["shared-qk", "lsh-4", "lsh-1", "local+lsh-4", "local+lsh-1", "full"]
    assert [e.label for e in eval_variants(("shared-qk",), [8, 1], True)] == [
        "full",
        "lsh-8",
        "lsh-1",
    ]
    assert eval_variants(("full",), [8, 1], True) == []  # separate QK: nothing can be swapped in
    assert eval_variants(("local",), [8], True) == []


def test_unavailable_backend_is_skipped_with_reason_and_unknown_one_raises(suite: Path) -> None:
    preset = load_task_preset(str(suite), "tiny")
    runs, skipped = plan_runs(
        preset, backends=["shared-qk", "xformers"], seeds=[0, 1], device="cpu"
    )
    assert [(r.variant.label, r.seed) for r in runs] == [("shared-qk", 0), ("shared-qk", 1)]
    assert [s.label for s in skipped] == ["xformers"] and "need CUDA" in skipped[0].reason
    with pytest.raises(UnknownNameError, match=r"known attention backends: .*shared-qk"):
        plan_runs(preset, backends=["flash"], device="cpu")


def _rows(variant: str, seed: int, accs: dict[str, float], steps_to: float | None) -> list[dict]:
    base = {"task": "duplication", "preset": "cpu", "backend": variant, "length": 128, "seed": seed}
    rows = [{**base, "metric": "accuracy", "value": v, "eval": e} for e, v in accs.items()]
    rows.append({**base, "metric": "steps_to_95", "value": steps_to, "eval": "trained"})
    rows.append({**base, "metric": "steps", "value": 500.0, "eval": "trained"})
    return rows


def test_table2_pivot_mean_spread_and_order() -> None:
    rows = (
        _rows("lsh-1", 0, {"trained": 0.9, "full": 0.5, "lsh-8": 0.99, "lsh-1": 0.9}, None)
        + _rows("shared-qk", 0, {"trained": 1.0, "full": 1.0, "lsh-8": 0.96, "lsh-1": 0.70}, 100.0)
        + _rows("shared-qk", 1, {"trained": 1.0, "full": 1.0, "lsh-8": 0.98, "lsh-1": 0.80}, 200.0)
        + _rows("full", 0, {"trained": 0.99}, 50.0)
    )
    table = build_matrix(rows)
    assert table.rows == ("shared-qk", "full", "lsh-1")
    assert table.columns == ("trained", "full", "lsh-8", "lsh-1")
    cell = table.accuracy[("shared-qk", "lsh-1")]
    assert cell.mean == pytest.approx(0.75) and cell.spread == pytest.approx(math.sqrt(0.005))
    text = format_matrix(table)
    assert "75.0% ± 7.1" in text and "150 ± 71" in text
    assert "not reached (cap 500)" in text
    header = text.splitlines()[0]
    assert header.index("Full") < header.index("LSH-8") < header.index("LSH-1")


def test_stored_tables_read_each_backends_latest_definition(tmp_path: Path) -> None:
    """A seed trained again with other steps (or after the preset was edited) is not averaged
    with the runs of the old definition: the table reads the latest, and counts the rest."""
    path = tmp_path / "zoo.sqlite"
    with ResultStore(path) as store:
        run_id = store.start_run(kind=KIND)
        for seed, steps in ((0, 30), (1, 30), (1, 2)):
            rows = _rows("shared-qk", seed, {"trained": steps / 100}, None)
            save_trained(store, run_id, {"train": {"max_steps": steps}, "seed": seed}, rows, {})
        other = _rows("full", 0, {"trained": 0.5}, None)  # another backend: its own latest
        save_trained(store, run_id, {"train": {"max_steps": 30}, "seed": 0}, other, {})
    back, left_out = load_rows(path)
    kept = {(r["backend"], r["seed"], r["value"]) for r in back if r["metric"] == "accuracy"}
    assert kept == {("shared-qk", 1, 0.02), ("full", 0, 0.5)} and left_out == 2
    assert load_rows(path, task="associative-recall") == ([], 0)


def test_a_table_never_sets_two_scorings_side_by_side(tmp_path: Path) -> None:
    """A table holding runs scored on the held-out test set shows only those: a backend whose
    runs were scored on the evaluation set (stored before the test set, or by an older install
    after it) is left out, even where they are its latest; a store of such runs alone still
    tabulates them."""
    path = tmp_path / "zoo.sqlite"
    old = _rows("lsh-2", 0, {"trained": 0.99}, None)
    new = _rows("shared-qk", 0, {"trained": 0.9}, None)
    older = _rows("shared-qk", 1, {"trained": 0.98}, None)
    with ResultStore(path) as store:
        run_id = store.start_run(kind=KIND)
        save_trained(store, run_id, {"seed": 0}, old, {})
        save_trained(store, run_id, {"seed": 0, "scored_on": SCORED_ON}, new, {})
        save_trained(store, run_id, {"seed": 1}, older, {})  # an older install, stored later
    back, left_out = load_rows(path)
    kept = {(r["backend"], r["value"]) for r in back if r["metric"] == "accuracy"}
    assert kept == {("shared-qk", 0.9)} and left_out == 2
    alone = tmp_path / "old.sqlite"
    with ResultStore(alone) as store:
        run_id = store.start_run(kind=KIND)
        save_trained(store, run_id, {"seed": 0}, old, {})
    back, left_out = load_rows(alone)
    assert {r["value"] for r in back if r["metric"] == "accuracy"} == {0.99} and left_out == 0


def test_the_reports_task_tables_hold_one_scoring() -> None:
    """The report's task tables read runs by the same rule as `zoo task --table2`."""
    import pandas as pd

    from attention_zoo.report.accuracy import _latest_definition

    part = pd.DataFrame(
        {
            "backend": ["lsh-2", "shared-qk", "shared-qk"],
            "created_at": [1.0, 2.0, 3.0],
            "config": [{"spec": {}}, {"spec": {"scored_on": SCORED_ON}}, {"spec": {}}],
        }
    )
    kept, earlier = _latest_definition(part)
    assert kept["created_at"].tolist() == [2.0] and earlier == 2


def test_results_round_trip_through_the_store(tmp_path: Path) -> None:
    path = tmp_path / "zoo.sqlite"
    rows = _rows("shared-qk", 0, {"trained": 1.0, "lsh-4": 0.9}, None)
    with ResultStore(path) as store:
        run_id = store.start_run(kind=KIND)
        key = save_trained(store, run_id, {"spec": 1}, rows, {"loss": [[10, 2.5]]})
        assert key == case_key(case_config(rows[0], {"spec": 1}))
        assert store.held_cases(statuses={"ok"}, kind=KIND) == {key}
    back, left_out = load_rows(path, task="duplication")

    def key(r):
        return (r["metric"], r["eval"])

    assert sorted(back, key=key) == sorted(rows, key=key) and left_out == 0
    assert load_rows(path, task="associative-recall") == ([], 0)
    with ResultStore(path) as store:  # metrics as the store shows them, config carries the curves
        assert {r["metric"] for r in store.rows()} == {
            "accuracy",
            "accuracy@lsh-4",
            "steps_to_95",
            "steps",
        }
        assert '"curves"' in store.rows()[0]["config"]


@pytest.mark.slow
def test_cli_runs_skips_stores_resumes_and_prints_table2(
    suite: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "zoo.sqlite"
    argv = [
        "task",
        str(suite),
        "--preset",
        "tiny",
        "--store",
        str(store),
        "--quiet",
        "--backends",
        "shared-qk,xformers",
        "--seeds",
        "0,1",
        "--threads",
        "1",
    ]
    threads = torch.get_num_threads()
    try:
        assert main([*argv, "--table2"]) == 0
        out = capsys.readouterr().out
        assert main(argv) == 0  # again: everything is found in the store
        again = capsys.readouterr().out
    finally:
        torch.set_num_threads(threads)  # --threads sets them for the whole process
    assert "; threads 1; store" in out
    assert "skipped xformers: backend 'xformers' unavailable: xformers kernels need CUDA" in out
    assert "[1/2] shared-qk seed 0:" in out and "[2/2] shared-qk seed 1:" in out
    assert "train \\ eval" in out and "shared-qk" in out.split("train \\ eval")[1]
    assert out.count("already in the store") == 0 and "already in the store" in again
    with ResultStore(store) as s:
        statuses = sorted(c["status"] for c in s.cases())
        assert statuses == ["ok", "ok", "skipped", "skipped"]  # nothing stored twice on re-running
        assert next(c["error"] for c in s.cases() if c["status"] == "skipped").startswith(
            "backend 'xformers'"
        )
        assert {r["threads"] for r in s.rows()} == {1}  # the rows record the threads they ran on


def test_cli_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(tmp_path / "zoo.sqlite")
    assert main(["task", "dedup", "--store", store]) == 2
    assert (
        "unknown task 'dedup'; known tasks: associative-recall, duplication"
        in capsys.readouterr().err
    )
    assert main(["task", "duplication", "--preset", "huge", "--store", store]) == 2
    assert "no preset 'huge'; presets: smoke, cpu, paper" in capsys.readouterr().err
    assert main(["task", "--table2", "--store", store]) == 2
    assert f"no results store at {store}" in capsys.readouterr().err
    assert main(["task", "--list"]) == 0
    assert "duplication: presets smoke, cpu, paper" in capsys.readouterr().out


def test_a_mix_gets_at_least_one_layer_per_backend(suite: Path) -> None:
    preset = load_task_preset(str(suite), "tiny")  # num_hidden_layers = 1
    runs, _ = plan_runs(preset, backends=["local+lsh", "shared-qk"], train_hashes=[2], device="cpu")
    depth = {r.variant.label: r.model_fields()["num_hidden_layers"] for r in runs}
    assert set(depth.values()) == {1, 2} and depth["shared-qk"] == 1
    for run in runs:  # the configuration the run trains is valid
        config = ReformerConfig.from_dict(run.model_fields())
        assert config.num_hidden_layers == len(run.variant.attn_layers)


def test_natural_order_reads_ascii_numbers_as_numbers() -> None:
    """Labels and preset names sort with their numbers read as numbers; other digits (e.g.
    superscripts) are text, never an error."""
    from attention_zoo.tasks.tabulate import natural_order

    labels = ["n128-d50", "n32-d100", "trained", "x2\u00b2", "n32-d50", "x1\u00b2"]
    assert sorted(labels, key=natural_order) == [
        "trained", "n32-d50", "n32-d100", "n128-d50", "x1\u00b2", "x2\u00b2"
    ]  # fmt: skip
