"""Every documented shell command runs, so a page cannot go stale quietly.

A command that takes seconds runs as printed, in a scratch folder holding a small store and the
getting-started plugin module. A zoo command that would train or measure for minutes runs with
`--dry-run` (flags, names, presets and store checked; the jobs listed; nothing run or written).
The rest need what a test cannot have here (a GPU, a cluster, git history, an hour of timing):
`ELSEWHERE` names each with where it runs instead. A command of none of these kinds fails
test_every_documented_command_is_placed until it is placed.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attention_zoo import cli
from attention_zoo.report.browser import chromium

from .conftest import registrations_undone
from .test_docs_examples import COMMANDS, ROOT, SHELL, Command, blocks, commands_of

CI = (ROOT / ".ci" / "run").read_text()  # what CI runs

# (pattern on the command as printed, where it runs instead): the first match places a command.
# "CI:" entries are checked against .ci/run, which must run that very command.
ELSEWHERE = [
    (
        r"^(?!zoo list|.*--dry-run).*(--devices? cuda|--preset gpu\b|-m gpu\b|gpu_check\.sh)",
        "needs a CUDA device",
    ),
    (r"^python benchmarks/scripts/gpu_targets\.py", "reads the store a GPU check writes"),
    (r"--ray-address|^ray start", "needs a Ray cluster"),
    (
        r"^pip install|^pre-commit install",
        "installs packages: CI installs the package and its extras (each named extra exists: "
        "test_docs_examples.py)",
    ),
    (r"^zoo .*--resume$", "continues the run the command above starts: tests/test_engine.py"),
    (
        r"^zoo memory --preset crime-and-punishment",
        "predicts a 0.5M-token training step op by op (about 100 s, past CI's budget); "
        "test_cli_bench.py runs zoo memory --fits at 64k tokens",
    ),
    (
        r"^python benchmarks/scripts/busy_probe\.py",
        "the quick preset twice (minutes); tests/test_busy.py probes a small grid",
    ),
    (r"^pip download .* -d \.whl ", "downloads wheels for the GPU machine (needs the network)"),
    (r"^ruff |^mkdocs build --strict$|^python -m pytest -q$", "CI: the same command"),
    (r"^python -m pytest -q -m 'not slow'$", "a subset of CI's `python -m pytest -q`"),
    (r"^python -m pytest -q -m long$", "CI: its `long and not alone` and `alone` passes"),
    (
        r"^python -m pytest tests/test_attention_contract\.py -k mine$",
        "test_the_plugin_walkthrough_runs runs it beside the plugin module",
    ),
    (
        r"^pytest benchmarks/micro ",
        "pytest-benchmark timings (minutes); test_micro_benchmarks.py checks what they collect",
    ),
    (r"^asv machine --yes$", "CI: the same command"),
    (r"^python benchmarks/scripts/gate\.py --fast --before-code-change$", "CI: the same command"),
    (
        r"^asv run --python=same --quick",
        "every benchmark once (minutes); CI's `asv check` checks the suite, the gate runs asv",
    ),
    (
        r"^asv run|^python benchmarks/scripts/gate\.py",
        "asv on git history (minutes); tests/test_gate.py runs the gate and --calibrate on clones",
    ),
    (
        r"^python benchmarks/scripts/noise\.py --series",
        "an hour of timing on an idle machine; tests/test_noise.py logs and reads a 2-round series",
    ),
    (
        r"^python benchmarks/scripts/noise\.py --read",
        "reads the log the --series run above writes; tests/test_noise.py reads a 2-round one",
    ),
    (
        r"^python benchmarks/scripts/acceptance\.py",
        "the gate's acceptance runs: an hour of timing on an idle machine; not run by the tests",
    ),
    (
        r"^python benchmarks/scripts/publish\.py",
        "rewrites reports/asv/: tests/test_gate.py runs it in a clone",
    ),
    (
        r"^python benchmarks/scripts/update_baselines\.py",
        "measures every baseline case (minutes); tests/test_benchmarks.py checks each case",
    ),
    (
        r"^python benchmarks/scripts/readme_numbers\.py --fresh$",
        "times the README's two commands (minutes); tests/test_readme_numbers.py checks it",
    ),
]
# Scripts that take seconds: run as printed.
SECONDS_SCRIPTS = (
    r"^python benchmarks/scripts/(record\.py .*--dry-run|decoding_targets\.py |readme_numbers\.py"
    r" --check$)"
)
# zoo commands that run jobs: run with --dry-run (appended where the page does not show it).
JOBS = re.compile(r"^(bench|reproduce \w|task \w(?!.*--dump))")


def _words(command: Command) -> str:
    return shlex.join(command.argv)


def zoo_argv(command: Command) -> list[str] | None:
    """The words after `zoo` (or `python -m attention_zoo`); None for another program."""
    argv = command.argv
    if argv[0] == "zoo":
        return argv[1:]
    if argv[:3] == ["python", "-m", "attention_zoo"]:
        return argv[3:]
    return None


def placed(command: Command) -> tuple[str, str]:
    """("run" | "dry-run" | "elsewhere", why) for one documented command."""
    text = _words(command)
    for pattern, where in ELSEWHERE:
        if re.search(pattern, text):
            return "elsewhere", where
    if (argv := zoo_argv(command)) is not None:
        return ("dry-run", "runs jobs") if JOBS.match(" ".join(argv)) else ("run", "seconds")
    if re.search(SECONDS_SCRIPTS, text):
        return "run", "seconds"
    return "unplaced", ""


def test_every_documented_command_is_placed() -> None:
    unplaced = [str(c) for c in COMMANDS if placed(c)[0] == "unplaced"]
    assert not unplaced, "teach tests/test_docs_commands.py where these run:\n" + "\n".join(
        unplaced
    )


def test_what_ci_runs_is_in_ci() -> None:
    """A command placed as CI's is a command of .ci/run: the same words, then only long options
    (nothing that selects less, such as pytest's -m) or a redirection."""
    ci = [c.argv for c in commands_of(".ci/run", CI)]
    for command in COMMANDS:
        how, where = placed(command)
        if how == "elsewhere" and where == "CI: the same command":
            n = len(command.argv)
            assert any(
                argv[:n] == command.argv and (len(argv) == n or argv[n].startswith(("--", ">")))
                for argv in ci
            ), str(command)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder as a user's looks after the pages' earlier steps: getting started's plugin module,
    results/zoo.sqlite with a few small cases (a peer, decoding) and my.sqlite with the plugin's."""
    folder = tmp_path_factory.mktemp("docs-commands")
    page = ROOT / "docs" / "getting-started.md"
    module = next(b for b in blocks(page) if b.title == "my_attention.py")
    (folder / "my_attention.py").write_text(module.text)
    (folder / "reports").mkdir()  # the checkout's folder of published reports, and its index
    shutil.copy(ROOT / "reports" / "README.md", folder / "reports" / "README.md")
    small = ["--lengths", "64", "--repeats", "2", "--no-progress", "--metrics"]
    decoding = ["--modes", "prefill,decode", "--new-tokens", "4"]
    plugin = ["--import", "my_attention", "--store", "my.sqlite"]
    with pytest.MonkeyPatch.context() as patch, registrations_undone():
        patch.chdir(folder)
        patch.syspath_prepend(str(folder))
        for argv in (
            ["bench", "--backends", "sdpa,local,lsh", "--peers", "hf", *small, "time,memory"],
            # the state each decoder keeps is predicted (--equal state reads it)
            ["bench", "--backends", "sdpa,local,linear", *decoding, *small, "time,predict"],
            ["bench", *plugin, "--backends", "mine,sdpa,lsh", *small, "time,memory"],
        ):
            code, out = _zoo(argv)
            assert code == 0, out
    return folder


def _zoo(argv: list[str]) -> tuple[int, str]:
    """zoo ARGV in this process: (exit code, what it printed)."""
    out = io.StringIO()
    threads = torch.get_num_threads()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = cli.main(argv)
    torch.set_num_threads(threads)
    return code, out.getvalue()


def _run(command: Command, folder: Path) -> tuple[int, str]:
    """One command as placed, from `folder`: (exit code, output)."""
    how, _ = placed(command)
    if (argv := zoo_argv(command)) is not None:
        dry = how == "dry-run" and "--dry-run" not in argv
        return _zoo([*argv, *(["--dry-run"] if dry else [])])
    proc = subprocess.run(
        [sys.executable, str(ROOT / command.argv[1]), *command.argv[2:]],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.returncode, proc.stdout + proc.stderr


def runnable_blocks() -> dict[str, list[Command]]:
    """Each shell block's commands a test runs, by where the block is; a block repeated on
    several pages (the quick start) once."""
    out: dict[str, list[Command]] = {}
    seen: set[tuple[str, ...]] = set()
    for block in SHELL:
        commands = [c for c in commands_of(block.where, block.text) if placed(c)[0] != "elsewhere"]
        words = tuple(_words(c) for c in commands)
        if commands and words not in seen:
            seen.add(words)
            out[block.where] = commands
    return out


RUNNABLE = runnable_blocks()


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize("where", RUNNABLE)
def test_documented_commands_run(
    where: str,
    prepared: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    clean_registries: None,
) -> None:
    """A block's commands in order, from a copy of the prepared folder: each exits 0; a dry run
    says what it would do and leaves every file of the folder as it was."""
    if any("--screenshot" in c.argv for c in RUNNABLE[where]) and chromium() is None:
        pytest.skip("no Chromium on PATH for zoo report --screenshot (.ci/run installs it)")
    folder = tmp_path / "work"
    shutil.copytree(prepared, folder)
    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(folder))
    for command in RUNNABLE[where]:
        before = _files(folder)
        with monkeypatch.context() as patch:
            for key, value in command.env.items():
                patch.setenv(key, value)
            code, out = _run(command, folder)
        assert code == 0, f"{command}:\n{out[-3000:]}"
        if placed(command)[0] == "dry-run":
            assert re.search(r"dry run, \w+: \d+ of \d+ to do", out), f"{command}:\n{out[-2000:]}"
            assert _files(folder) == before, f"{command} wrote to the folder"


def _files(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under `folder`: (size, modification time in ns; a folder's size
    -1), by relative path."""
    return {
        str(p.relative_to(folder)): (p.stat().st_size if p.is_file() else -1, p.stat().st_mtime_ns)
        for p in folder.rglob("*")
    }
