"""Every example in the README and in docs/ works as printed, so a page cannot go stale quietly.

The default run parses every shell command with the parser of the program it calls (zoo's own, a
script's argparse, asv's) without running it, checks the files and extras it names, and runs the
cheap Python examples. The `long` tests run the expensive Python examples and the documented
walk-through of a plugin backend for real. A new kind of command fails `test_every_command_is_known`
until it is taught here.
"""

from __future__ import annotations

import argparse
import os
import re
import runpy
import shlex
import subprocess
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from attention_zoo import cli

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)(?P<attrs>.*)$")
SNIPPET = re.compile(r'^--8<-- "(?P<path>[^"]+)"$')
TITLE = re.compile(r'title="(?P<title>[^"]+)"')
HEADING = re.compile(r"^#{1,6} +(.+?) *$")

# Python examples that take more than a second or so of CPU: run by the `long` test only.
# (page, heading) -> why; every entry must still name an example (test_slow_examples_exist).
SLOW_PYTHON = {
    ("docs/decoding.md", "Generate"): "a model generates 32 tokens three ways",
    ("docs/model.md", "The Reformer model"): "a training step of a 2-layer model at 1,000 tokens",
    ("docs/model.md", "Hugging Face checkpoints"): "a 6-layer HF model built, saved and converted",
}
# Programs documented but not ours to parse: what the check is instead.
EXTERNAL = {
    "ray": "Ray's CLI (the ray extra)",
    "ruff": "pinned in the lint extra",
    "pre-commit": "in the dev extra",
    "mkdocs": "in the docs extra; CI builds the pages",
    "gh": "GitHub's CLI, in the workflow file",
}


@dataclass(frozen=True)
class Block:
    """One fenced example."""

    page: Path
    line: int
    lang: str
    title: str | None
    heading: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The page's fenced blocks, snippet lines (`--8<-- "path"`) replaced by the file's text."""
    found, heading, lines = [], "", page.read_text().splitlines()
    i = 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if not opened:
            if match := HEADING.match(lines[i]):
                heading = match.group(1)
            i += 1
            continue
        start, body = i + 1, []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            snippet = SNIPPET.match(lines[i].strip())
            body.extend(
                (ROOT / snippet.group("path")).read_text().splitlines() if snippet else [lines[i]]
            )
            i += 1
        title = TITLE.search(opened.group("attrs"))
        found.append(
            Block(
                page,
                start,
                opened.group("lang"),
                title.group("title") if title else None,
                heading,
                "\n".join(body) + "\n",
            )
        )
        i += 1
    return found


BLOCKS = [b for page in PAGES for b in blocks(page)]
SHELL = [b for b in BLOCKS if b.lang in ("bash", "sh")]
PYTHON = [b for b in BLOCKS if b.lang == "python" and b.title is None]
MODULES = [b for b in BLOCKS if b.lang == "python" and b.title is not None]


def workflow_commands() -> Iterator[tuple[str, str]]:
    """(where, script) of every `run:` step of the workflow files shown in the docs."""
    yaml = pytest.importorskip("yaml")
    for path in sorted((ROOT / "docs" / "examples").glob("*.yml")):
        for name, job in yaml.safe_load(path.read_text())["jobs"].items():
            for step in job["steps"]:
                if "run" in step:
                    yield f"{path.relative_to(ROOT)}: {name}: {step.get('name', '')}", step["run"]


@dataclass(frozen=True)
class Command:
    where: str
    env: dict[str, str]
    argv: list[str]

    def __str__(self) -> str:
        return f"{self.where}: {shlex.join(self.argv)}"


def commands_of(where: str, script: str) -> list[Command]:
    """A shell script's simple commands: continuation lines joined, comments dropped, split at
    `&&`, leading VAR=value assignments kept apart."""
    out = []
    for line in script.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            part, words = words[:cut], words[cut + 1 :]
            env = {}
            while part and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", part[0]):
                key, _, value = part.pop(0).partition("=")
                env[key] = value
            if part:
                out.append(Command(where, env, part))
    return out


COMMANDS = [c for b in SHELL for c in commands_of(b.where, b.text)]


class _Parsed(Exception):
    """Raised by the patched ArgumentParser.parse_args: the arguments were accepted."""


def check_script(command: Command, monkeypatch: pytest.MonkeyPatch) -> None:
    """`python SCRIPT ARGS`: the script's own argparse accepts ARGS (nothing runs)."""
    script = ROOT / command.argv[1]
    assert script.is_file(), f"{command}: no such script"
    original = argparse.ArgumentParser.parse_args

    def parse_only(self: argparse.ArgumentParser, args: list[str] | None = None, ns=None):
        original(self, args, ns)
        raise _Parsed

    def refuse(self: argparse.ArgumentParser, message: str):
        raise AssertionError(f"{command}: {message}")

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_only)
    monkeypatch.setattr(argparse.ArgumentParser, "error", refuse)
    monkeypatch.setattr(sys, "argv", [str(script), *command.argv[2:]])
    monkeypatch.syspath_prepend(str(script.parent))
    with pytest.raises(_Parsed):
        runpy.run_path(str(script), run_name="__main__")


def check_zoo(command: Command, argv: list[str], known_backends: set[str]) -> None:
    """`zoo ARGS`: zoo's parser accepts ARGS, and the presets, tasks, reproductions and backends
    they name exist."""
    from attention_zoo import REPRODUCTIONS, TASKS, list_backends
    from attention_zoo.presets import builtin_presets

    args = cli.parse(cli.build_parser(), argv)
    if getattr(args, "preset", None) and args.command in ("bench", "memory"):
        assert args.preset in builtin_presets(), f"{command}: no preset {args.preset!r}"
    if args.command == "task" and args.run_spec:
        assert args.run_spec in TASKS, f"{command}: no task {args.run_spec!r}"
    if args.command == "reproduce" and args.paper:
        assert args.paper in REPRODUCTIONS, f"{command}: no reproduction {args.paper!r}"
    backends = getattr(args, "backends", None) or []
    known = {s.name for s in list_backends()} | known_backends | {"all"}
    for name in backends.split(",") if isinstance(backends, str) else backends:
        assert name in known, f"{command}: no backend {name!r}"


def check_pytest(command: Command, argv: list[str]) -> None:
    """pytest ARGS: the paths exist and -m names declared markers."""
    markers = {m.split(":")[0] for m in PYPROJECT["tool"]["pytest"]["ini_options"]["markers"]}
    words = iter(argv)
    for word in words:
        if word == "-m":
            names = set(re.findall(r"\w+", next(words))) - {"and", "or", "not"}
            assert names <= markers, f"{command}: undeclared markers {names - markers}"
        elif word in ("-k", "-p", "-n"):
            next(words)
        elif not word.startswith("-"):
            assert (ROOT / word.split("::")[0]).exists(), f"{command}: no {word}"


def check_pip(command: Command, argv: list[str]) -> None:
    """pip install -e ".[extras]": every extra is declared."""
    extras = PYPROJECT["project"]["optional-dependencies"]
    for word in argv:
        if match := re.fullmatch(r"\.\[([\w,-]+)\]", word):
            missing = set(match.group(1).split(",")) - set(extras)
            assert not missing, f"{command}: no extra {missing}"


def check_asv(command: Command, argv: list[str]) -> None:
    from asv.commands import make_argparser

    parser, _ = make_argparser()
    parser.error = lambda message: pytest.fail(f"{command}: {message}")  # type: ignore[method-assign]
    args = parser.parse_args(argv)
    for pattern in getattr(args, "bench", None) or []:
        re.compile(pattern)


def check(command: Command, monkeypatch: pytest.MonkeyPatch, known: set[str]) -> str:
    """Check one documented command without running it; returns what was checked."""
    argv = command.argv
    if argv[0] == "zoo" or argv[:3] == ["python", "-m", "attention_zoo"]:
        check_zoo(command, argv[1:] if argv[0] == "zoo" else argv[3:], known)
        return "zoo's parser"
    if argv[0] == "pytest" or argv[:3] == ["python", "-m", "pytest"]:
        check_pytest(command, argv[1:] if argv[0] == "pytest" else argv[3:])
        return "pytest paths and markers"
    if argv[0] == "pip" or argv[:3] == ["python", "-m", "pip"]:
        check_pip(command, argv)
        return "pip extras"
    if argv[0] == "python" and argv[1].endswith(".py"):
        check_script(command, monkeypatch)
        return "the script's argparse"
    if argv[:2] == ["python", "-m"]:
        assert (ROOT / (argv[2].replace(".", "/") + ".py")).is_file(), f"{command}: no module"
        return "the module exists"
    if argv[0] == "bash":
        subprocess.run(["bash", "-n", str(ROOT / argv[1])], check=True)
        return "bash -n"
    if argv[0] == "asv":
        check_asv(command, argv[1:])
        return "asv's parser"
    if argv[0] in EXTERNAL:
        return EXTERNAL[argv[0]]
    pytest.fail(f"{command}: a kind of command this test does not know; teach it here")


def registered_by_modules() -> set[str]:
    return {n for b in MODULES for n in re.findall(r'register_attention\(\s*"([\w-]+)"', b.text)}


def test_examples_are_found() -> None:
    """The parser of this test sees the pages' examples (a broken fence would hide them)."""
    assert len(PAGES) > 10 and len(COMMANDS) > 50 and len(PYTHON) > 5 and MODULES
    assert all(b.text.strip() for b in BLOCKS)


@pytest.mark.slow
def test_every_command_is_known(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every documented shell command (and every `run:` step of the workflow files) is accepted
    by the parser of what it calls, with files, extras, presets and names that exist."""
    known = registered_by_modules()
    workflow = [c for w, s in workflow_commands() for c in commands_of(w, s)]
    assert any("gate.py" in " ".join(c.argv) for c in workflow)
    for command in [*COMMANDS, *workflow]:
        with monkeypatch.context() as patch:
            check(command, patch, known)


def test_toml_and_yaml_examples_parse() -> None:
    yaml = pytest.importorskip("yaml")
    for block in BLOCKS:
        if block.lang == "toml":
            tomllib.loads(block.text)
        elif block.lang == "yaml":
            assert yaml.safe_load(block.text), block.where


def test_slow_examples_exist() -> None:
    named = {(str(b.page.relative_to(ROOT)), b.heading) for b in PYTHON}
    assert set(SLOW_PYTHON) <= named, set(SLOW_PYTHON) - named


def _run_python(block: Block, folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """Run the example as a module of its own (named as its title says), from `folder`."""
    monkeypatch.chdir(folder)
    module = types.ModuleType(Path(block.title).stem if block.title else "__example__")
    monkeypatch.setitem(sys.modules, module.__name__, module)  # dataclasses look it up
    exec(compile(block.text, block.where, "exec"), module.__dict__)
    return module.__dict__


def _is_slow(block: Block) -> bool:
    return (str(block.page.relative_to(ROOT)), block.heading) in SLOW_PYTHON


@pytest.mark.parametrize("block", [b for b in PYTHON if not _is_slow(b)], ids=lambda b: b.where)
def test_python_example_runs(
    block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_registries: None
) -> None:
    _run_python(block, tmp_path, monkeypatch)


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize("block", [b for b in PYTHON if _is_slow(b)], ids=lambda b: b.where)
def test_slow_python_example_runs(
    block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_registries: None
) -> None:
    _run_python(block, tmp_path, monkeypatch)


@pytest.mark.parametrize("block", MODULES, ids=lambda b: b.where)
def test_module_example_registers_a_working_backend(
    block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_registries: None
) -> None:
    """A `title="my_attention.py"` example is a module: imported, each backend it registers is
    built and run, causal and bidirectional, with padding."""
    import torch

    from attention_zoo import build_attention

    names = _run_python(block, tmp_path, monkeypatch)
    assert block.title.endswith(".py") and names
    for name in re.findall(r'register_attention\(\s*"([\w-]+)"', block.text):
        q = torch.randn(1, 2, 16, 8)
        mask = torch.ones(1, 16, dtype=torch.bool)
        for causal in (True, False):
            out = build_attention(name, causal=causal)(q, q, q, key_padding_mask=mask)
            assert out.shape == q.shape and torch.isfinite(out).all()


@pytest.mark.slow
@pytest.mark.long
def test_the_plugin_walkthrough_runs(tmp_path: Path) -> None:
    """Getting started's own commands, run as printed from a folder holding my_attention.py."""
    page = ROOT / "docs" / "getting-started.md"
    module = next(b for b in blocks(page) if b.title == "my_attention.py")
    (tmp_path / "my_attention.py").write_text(module.text)
    section = [b for b in blocks(page) if b.lang == "bash" and "--import" in b.text]
    assert len(section) == 1
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    env.pop("ZOO_IMPORT", None)
    for command in commands_of(section[0].where, section[0].text):
        argv = command.argv
        if argv[0] == "zoo":
            argv = [sys.executable, "-m", "attention_zoo", *argv[1:]]
        elif argv[:3] == ["python", "-m", "pytest"]:
            argv = [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-n",
                "0",
                *argv[3:],
            ]
            argv = [a if not a.startswith("tests/") else str(ROOT / a) for a in argv]
        proc = subprocess.run(
            argv,
            cwd=tmp_path,
            env={**env, **command.env},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, f"{command}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    assert (tmp_path / "my-report" / "report.html").is_file()


# ---- the pages themselves ---------------------------------------------------------------------


def paragraphs(page: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of each paragraph or list item outside fences, tables and headings."""
    current: list[str] = []
    start, fence = 0, False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if FENCE.match(line):
            fence = not fence
        breaks = (
            fence
            or not line.strip()
            or line.lstrip().startswith(("|", "#", "```", "- ", "* "))
            or re.match(r"\s*\d+\. ", line)
        )
        if breaks and current:
            yield start, " ".join(current)
            current = []
        if fence or not line.strip() or line.lstrip().startswith(("|", "#", "```")):
            continue
        if not current:
            start = number
        current.append(re.sub(r"<!--.*?-->", "", line))
    if current:
        yield start, " ".join(current)


def test_the_readme_is_a_landing_page() -> None:
    """At most 200 lines; no paragraph over 120 words, there or in the docs."""
    assert len(README.read_text().splitlines()) <= 200
    long = [
        f"{page.relative_to(ROOT)}:{line} ({len(text.split())} words)"
        for page in PAGES
        for line, text in paragraphs(page)
        if len(text.split()) > 120
    ]
    assert not long


def _slug(heading: str) -> str:
    """The anchor MkDocs (and GitHub, for these headings) gives a heading."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def test_the_readme_links_resolve() -> None:
    """MkDocs checks the docs' links (mkdocs build --strict); the README is outside them."""
    for target in re.findall(r"\]\(([^)]+)\)", README.read_text()):
        if target.startswith("http"):
            continue
        path, _, anchor = target.partition("#")
        assert (ROOT / path).exists(), target
        if anchor:
            headings = re.findall(r"^#{1,6} +(.+?) *$", (ROOT / path).read_text(), re.M)
            assert anchor in {_slug(h) for h in headings}, target


def test_every_backend_is_in_the_backend_tables() -> None:
    from attention_zoo import list_backends

    for page in (README, ROOT / "docs" / "backends.md"):
        rows = set(re.findall(r"^\| `([\w-]+)` \|", page.read_text(), re.M))
        names = {s.name for s in list_backends()}
        assert names <= rows, (page.name, names - rows)
