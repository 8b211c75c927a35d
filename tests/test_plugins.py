"""Plugins from outside the package reach every command: a module via --import (or ZOO_IMPORT), an
installed package via its `attention_zoo.plugins` entry point; a broken one is reported and the rest
still works."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attention_zoo.attention.spec import BACKENDS
from attention_zoo.blocks.residual import RESIDUALS
from attention_zoo.cli import main
from attention_zoo.measure.peers import PEERS
from attention_zoo.plugins import PLUGINS, child_environment, import_target, load_plugins
from attention_zoo.registry import pluggable_registries
from attention_zoo.store import ResultStore
from attention_zoo.tasks import TASKS

from . import test_attention_contract as contract
from . import test_decoding_contract as decoding

ROOT = Path(__file__).resolve().parents[1]
MODULE = "zoo_test_plugin"
PLUGIN_SOURCE = '''
"""A throwaway attention-zoo plugin: a backend, a residual variant and a task."""

from dataclasses import dataclass

import torch

from attention_zoo import AttentionCore, Capabilities, register_attention
from attention_zoo.blocks.residual import RESIDUALS, StandardResidual
from attention_zoo.tasks import Batch, TaskConfig, register_task


@dataclass(frozen=True, kw_only=True)
class MineConfig:
    """Options of mine."""

    temperature: float = 1.0  # 1.0: exactly full softmax attention


@register_attention("mine", config=MineConfig, caps=Capabilities(exact=True))
class MineAttention(AttentionCore):
    """Full softmax attention written out (a plugin)."""

    def attend(self, q, k, v, key_padding_mask):
        scores = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5 / self.cfg.temperature)
        if self.causal:
            i = torch.arange(q.shape[-2], device=q.device)
            scores = scores.masked_fill(i[None, :] > i[:, None], -1e9)
        if key_padding_mask is not None:
            scores = scores.masked_fill(~key_padding_mask[:, None, None, :], -1e9)
        return scores.softmax(-1) @ v


class MineResidual(StandardResidual):
    """The standard residual under another name (a plugin)."""


RESIDUALS.add("mine-residual", MineResidual)


@register_task("mine-task")
@dataclass(frozen=True, kw_only=True)
class MineTask(TaskConfig):
    """Repeat the previous token (a plugin)."""

    def sample(self, batch_size, generator):
        ids = torch.randint(0, self.vocab_size, (batch_size, self.seq_len), generator=generator)
        return Batch(ids, ids.clone())

    def chance_accuracy(self):
        return 1 / self.vocab_size
'''
FAST = ["--budget", "0", "--repeats", "1", "--threads", "1", "--no-progress"]


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_registries: None) -> Path:
    """A folder on sys.path holding the plugin module, and the working directory."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / f"{MODULE}.py").write_text(PLUGIN_SOURCE)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.chdir(tmp_path)
    return folder


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_an_imported_module_is_listed_benchmarked_and_reported(
    plugin_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "list", "--import", MODULE, "--device", "cpu")
    assert code == 0 and err == "", err
    (row,) = [line for line in out.splitlines() if line.startswith("mine ")]
    assert f"--import {MODULE}" in row and "temperature=1.0" in row
    assert f"mine-task (--import {MODULE})" in out and f"mine-residual (--import {MODULE})" in out
    assert "full " in out and "duplication" in out  # the built-ins are all still there
    code, out, err = run(
        capsys,
        "--import",  # before the subcommand works too
        MODULE,
        "bench",
        "--target",
        "attention",
        "--backends",
        "mine,full",
        "--lengths",
        "32",
        "--metrics",
        "time,memory",
        "--store",
        "zoo.sqlite",
        *FAST,
    )
    assert code == 0, err
    (row,) = [line for line in out.splitlines() if line.startswith("attention  mine")]
    assert " ok " in row
    code, out, err = run(capsys, "report", "--store", "zoo.sqlite", "--out", "report")
    assert code == 0, err
    assert "mine" in Path("report/report.md").read_text()


@pytest.mark.slow
def test_a_plugin_file_path_and_zoo_import_work_too(
    plugin_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(plugin_dir / f"{MODULE}.py")
    code, out, _ = run(capsys, "list", "--import", path)
    assert code == 0 and f"--import {path}" in out
    assert child_environment()["ZOO_IMPORT"] == path  # an isolated worker loads it again


@pytest.mark.slow  # a two-step training run per task
@pytest.mark.parametrize("task", ["niah", "state-tracking", "selective-copying", "forgetting-mqar"])
def test_a_plugin_backend_trains_on_every_new_task(
    plugin_dir: Path, capsys: pytest.CaptureFixture[str], task: str
) -> None:
    """The tasks take any registered causal backend, a plugin's too, as `zoo task` runs them."""
    argv = ["task", task, "--preset", "smoke", "--import", MODULE, "--backends", "mine"]
    code, _, err = run(capsys, *argv, "--max-steps", "2", "--quiet", "--store", "t.db")
    assert code == 0, err
    with ResultStore(plugin_dir.parent / "t.db") as store:
        cases = store.cases()
    assert cases and {(c["config"]["backend"], c["status"]) for c in cases} == {("mine", "ok")}


@pytest.mark.slow
def test_zoo_import_environment_variable(
    plugin_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ZOO_IMPORT", f" {MODULE} ,")
    code, out, err = run(capsys, "list")
    assert code == 0 and err == "" and f"ZOO_IMPORT {MODULE}" in out


def test_a_plugin_backend_keeps_the_conformance_contract(plugin_dir: Path) -> None:
    """The suite every built-in passes (tests/test_attention_contract.py), run on the plugin."""
    import_target(MODULE)
    spec = BACKENDS.get("mine")
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        contract.test_shape_dtype_and_finite(spec, dtype)
    for causal in (False, True):
        contract.test_gradients_reach_every_parameter(spec, causal)
    for changed in "qkv":
        contract.test_causal_backends_are_exactly_causal(spec, changed)
    for padded in (False, True):
        contract.test_exact_backends_agree_with_reference(spec, padded)
    contract.test_forward_runs_on_meta_device(spec)
    contract.test_strided_inputs_give_the_dense_results(spec)
    contract.test_padding_keys_never_change_real_outputs(spec)
    decoding.test_decoding_is_known_without_building(spec)
    for padded in (False, True):  # a plugin decodes by recomputing its prefix
        decoding.test_prefill_and_steps_equal_the_causal_forward(spec, padded)


def _install(site: Path, dist: str, entry_points: str, modules: dict[str, str]) -> None:
    """What pip would leave: modules and a .dist-info with entry_points.txt, in `site`."""
    info = site / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[attention_zoo.plugins]\n{entry_points}\n")
    for name, source in modules.items():
        (site / f"{name}.py").write_text(source)


@pytest.mark.slow
def test_an_installed_entry_point_is_loaded_by_every_command(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    clean_registries: None,
) -> None:
    site = tmp_path / "site"
    source = PLUGIN_SOURCE.replace('"mine"', '"epmine"').replace('"mine-task"', '"ep-task"')
    source = source.replace('"mine-residual"', '"ep-residual"')
    _install(site, "zoo-ep-plugin", "epmine = zoo_ep_plugin", {"zoo_ep_plugin": source})
    monkeypatch.syspath_prepend(str(site))
    code, out, err = run(capsys, "list")
    assert code == 0 and err == "", err
    (row,) = [line for line in out.splitlines() if line.startswith("epmine ")]
    assert "plugin 'epmine' (zoo-ep-plugin 0.1)" in row
    code, out, _ = run(capsys, "bench", "--backends", "epmine", "--lengths", "32", "--dry-run")
    assert code == 0 and "1 of 1 to do" in out


@pytest.mark.slow
def test_a_broken_plugin_is_one_warning_and_the_rest_works(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    clean_registries: None,
) -> None:
    site = tmp_path / "site"
    broken = (  # registers a backend, then fails: the half-done registration is undone
        PLUGIN_SOURCE.replace('"mine"', '"halfway"').split("class MineResidual")[0] + "1 / 0\n"
    )
    _install(site, "zoo-broken", "broken = zoo_broken_plugin", {"zoo_broken_plugin": broken})
    monkeypatch.syspath_prepend(str(site))
    code, out, err = run(capsys, "list")
    assert code == 0 and "full " in out and "lsh " in out and "halfway" not in out
    (line,) = err.splitlines()
    assert line.startswith("zoo: warning: plugin 'broken' (zoo-broken 0.1) failed to load: ")
    assert "ZeroDivisionError: division by zero" in line and "continuing without it" in line
    assert "halfway" not in BACKENDS
    # asked for by name it is an error: the command would not do what was asked
    code, _, err = run(capsys, "list", "--import", "zoo_broken_plugin")
    assert code == 2 and len(err.splitlines()) == 2  # the entry point's warning + the error
    assert err.splitlines()[1].startswith("zoo list: error: --import zoo_broken_plugin failed")


def test_every_pluggable_registry_is_tracked_a_peer_too(
    tmp_path: Path, clean_registries: None
) -> None:
    """A plugin's additions to any registry (here a peer) get its origin, or are undone when it
    fails; the plugins' own registry is not one a plugin adds to."""
    assert {BACKENDS, RESIDUALS, TASKS, PEERS} <= set(pluggable_registries())
    assert PLUGINS not in pluggable_registries()
    source = (
        "import dataclasses\n"
        "from attention_zoo.measure.peers import PEERS, get_peer\n"
        'PEERS.add("mine:lsh", dataclasses.replace(get_peer("hf:lsh"), name="mine:lsh"))\n'
    )
    broken, working = tmp_path / "zoo_peer_broken.py", tmp_path / "zoo_peer_working.py"
    broken.write_text(source + "1 / 0\n")
    working.write_text(source)
    (failure,) = load_plugins([str(broken)], report=False)
    assert "ZeroDivisionError" in failure.error and "mine:lsh" not in PEERS
    assert load_plugins([str(working)], report=False) == []
    assert PEERS.origin("mine:lsh") == f"--import {working}"


@pytest.mark.slow
@pytest.mark.long
def test_user_path_subprocesses_conformance_suite_and_isolated_worker(plugin_dir: Path) -> None:
    """As a user runs it: the conformance suite picks the plugin up from ZOO_IMPORT, and an
    isolated bench worker (a fresh process) loads the --import module again."""
    env = {**os.environ, "ZOO_IMPORT": str(plugin_dir / f"{MODULE}.py")}
    contract_file = str(ROOT / "tests" / "test_attention_contract.py")
    suite = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-n",
            "0",
            "-k",
            "mine",
            contract_file,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert suite.returncode == 0 and " passed" in suite.stdout, suite.stdout[-2000:]
    grid = ["--target", "attention", "--backends", "mine", "--lengths", "32", "--metrics", "memory"]
    zoo = [sys.executable, "-m", "attention_zoo", "bench", "--import", MODULE, "--isolate"]
    bench = subprocess.run(
        [*zoo, *grid, "--store", "z.sqlite", *FAST],
        capture_output=True,
        text=True,
        env={
            **{k: v for k, v in os.environ.items() if k != "ZOO_IMPORT"},
            "PYTHONPATH": os.pathsep.join([str(plugin_dir), os.environ.get("PYTHONPATH", "")]),
        },
    )
    assert bench.returncode == 0, bench.stderr
    (row,) = [line for line in bench.stdout.splitlines() if line.startswith("attention  mine")]
    assert " ok " in row
    with ResultStore("z.sqlite", write=False) as store:  # what the worker ran it as, stored
        assert store.rows()[0]["facts"]["capabilities"]["mine"]["kind"] == "full"


@pytest.fixture
def suite(monkeypatch: pytest.MonkeyPatch):
    """The asv suite's common module, imported without its FakeTensorMode warm-up."""
    monkeypatch.setenv("ZOO_ASV_NO_WARMUP", "1")
    from benchmarks import common

    return common


def test_asv_suite_finds_a_relative_zoo_import_from_where_asv_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_registries: None, suite
) -> None:
    """asv imports the suite in a temporary folder: `ZOO_IMPORT=my_attention asv run` from the
    folder holding my_attention.py benchmarked nothing of it before."""
    started, benchmarks_cwd = tmp_path / "checkout", tmp_path / "asv-tmp"
    started.mkdir()
    benchmarks_cwd.mkdir()
    (started / "zoo_asv_plugin.py").write_text(PLUGIN_SOURCE)
    monkeypatch.chdir(benchmarks_cwd)
    monkeypatch.setenv("PWD", str(started))  # what the shell that started asv exported
    monkeypatch.setenv("ZOO_IMPORT", "zoo_asv_plugin")
    suite.load_suite_plugins()
    assert "mine" in BACKENDS.names() and os.getcwd() == str(benchmarks_cwd)


def test_asv_suite_stops_on_a_zoo_import_that_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_registries: None, suite
) -> None:
    from attention_zoo.errors import PluginError

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PWD", str(tmp_path))
    monkeypatch.setenv("ZOO_IMPORT", "zoo_not_there")
    with pytest.raises(PluginError, match="ZOO_IMPORT zoo_not_there failed to load"):
        suite.load_suite_plugins()


@pytest.mark.slow
def test_a_zoo_import_that_fails_is_an_error_in_every_entry_point(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    clean_registries: None,
) -> None:
    """Before: one warning in `zoo`, and every test silently deselected in pytest."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ZOO_IMPORT", "zoo_not_there")
    code, _, err = run(capsys, "list")
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith("zoo list: error: ZOO_IMPORT zoo_not_there failed to load")
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "--co",
         str(ROOT / "tests" / "test_registry.py")],
        capture_output=True, text=True, env={**os.environ, "ZOO_IMPORT": "zoo_not_there"},
    )  # fmt: skip
    assert tests.returncode == 4, tests.stdout + tests.stderr
    (line,) = tests.stderr.strip().splitlines()
    assert "ZOO_IMPORT zoo_not_there failed to load" in line and "no test runs" in line


TYPED_SOURCE = '''
"""A plugin whose options are typed only by its dataclass (no checks of its own)."""

from dataclasses import dataclass

from attention_zoo import AttentionCore, Capabilities, register_attention


@dataclass(frozen=True, kw_only=True)
class TypedConfig:
    """Options of typed."""

    window: int = 4  # keys less than `window` positions away


@register_attention("typed", config=TypedConfig, caps=Capabilities(exact=False))
class TypedAttention(AttentionCore):
    """Attends to v as it is."""

    def attend(self, q, k, v, key_padding_mask):
        return v
'''


@pytest.mark.parametrize(("value", "shown"), [("abc", "'abc'"), ("3.5", "3.5"), ("true", "True")])
def test_plugin_options_are_checked_against_their_dataclass(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    clean_registries: None,
    value: str,
    shown: str,
) -> None:
    """Before: window=abc became an error row, 3.5 was accepted for an int."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "zoo_typed_plugin.py").write_text(TYPED_SOURCE)
    argv = ["bench", "--import", "zoo_typed_plugin.py", "--backends", "typed", "--lengths", "8",
            "--option", f"typed.window={value}", "--store", "s.sqlite", *FAST]  # fmt: skip
    code, _, err = run(capsys, *argv)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"backend 'typed' option window must be an int, got {shown}" in err
    assert not (tmp_path / "s.sqlite").exists()
