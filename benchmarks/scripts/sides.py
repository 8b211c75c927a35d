"""The sides of a comparison: a clean environment per commit, and asv's rounds run in it.

A side is a fresh virtual environment that holds one commit's package, taken from git, and no
other copy of the project; its dependencies (torch, numpy, asv's runner) are the interpreter's
that runs the gate, on a path file, so both sides measure with the same libraries, offline, and
no side is ever installed over another. asv runs this checkout's suite (benchmarks/) in each
side's interpreter with a discovery of its own: the suite's parameters come from the registry of
the code installed, and asv names a parameter combination by its index, so two sides whose
backends differ must never share one discovery (a backend added on one side would shift the
indices of every later one on the other).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "attention_zoo"  # the project's importable package: what a side holds of its commit
DEPS_PTH = "zoo_gate_dependencies.pth"


class SideError(Exception):
    """A side could not be built or run (the gate's "could not decide")."""


@dataclass(frozen=True)
class Side:
    """One commit's clean environment."""

    commit: str
    folder: Path

    @property
    def python(self) -> Path:
        return self.folder / "bin" / "python"

    @property
    def site_packages(self) -> Path:
        (found,) = self.folder.glob("lib/python*/site-packages")
        return found

    def run_python(self, code: str) -> str:
        """Run `code` in this side's interpreter (no PYTHONPATH, as asv runs it); its stdout."""
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        proc = subprocess.run(
            [str(self.python), "-c", code], capture_output=True, text=True, env=env, cwd=self.folder
        )
        if proc.returncode != 0:
            raise SideError(f"the side of {self.commit[:8]} failed to run Python:\n{proc.stderr}")
        return proc.stdout


def dependency_paths() -> list[str]:
    """The site-packages folders of the interpreter running this (its venv, the system's, the
    user's): where the dependencies are. A checkout on sys.path (an editable install, PYTHONPATH)
    is not one of them, and a path file only adds folders: the .pth files inside them (an editable
    install's finder) do not run in a side."""
    return [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]


def build_side(root: Path, commit: str, folder: Path) -> Side:
    """A fresh virtual environment at `folder` with `commit`'s package (as git has it) and the
    dependencies of the running interpreter; SideError if the package would import from
    anywhere else."""
    if folder.exists():
        raise SideError(f"{folder} exists: a side is always built fresh")
    made = subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(folder)], capture_output=True, text=True
    )
    if made.returncode != 0:
        raise SideError(f"python -m venv {folder} failed: {made.stderr.strip()}")
    side = Side(commit, folder)
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit, PACKAGE], cwd=root, capture_output=True
    )
    if archive.returncode != 0:
        raise SideError(
            f"git archive {commit[:8]} {PACKAGE} failed: {archive.stderr.decode().strip()}"
        )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(side.site_packages)  # our own repository's files
    (side.site_packages / DEPS_PTH).write_text("\n".join(dependency_paths()) + "\n")
    origin = side.run_python(
        f"import importlib.util as u; print(u.find_spec({PACKAGE!r}).origin)"
    ).strip()
    if not Path(origin).is_relative_to(side.site_packages):
        raise SideError(f"{PACKAGE} imports from {origin} in the side of {commit[:8]}")
    return side


def round_args(
    side: Side, conf_path: Path, machine: str, bench: Sequence[str], attributes: dict[str, str]
) -> list[str]:
    """`asv run` arguments for one round on `side`: its own interpreter and discovery, results
    filed under its commit, samples appended to the rounds before."""
    args = ["run", "--config", str(conf_path), "--machine", machine]
    args += ["--environment", f"existing:{side.python}", "--set-commit-hash", side.commit]
    args += ["--append-samples", "--launch-method", "forkserver", "--show-stderr"]
    for key, value in {"rounds": "1", **attributes}.items():
        args += ["-a", f"{key}={value}"]
    for regex in bench:
        args += ["--bench", regex]
    return args


def interleaved(sides: Sequence[Side], rounds: int) -> list[Side]:
    """The order of the rounds, ABBA: each side as often first as second, so that a drift of the
    machine during the comparison weighs on both sides alike."""
    first, second = sides
    order: list[Side] = []
    for r in range(rounds):
        order += [first, second] if r % 2 == 0 else [second, first]
    return order
