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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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


def dependency_paths(root: Path) -> list[str]:
    """The folders the interpreter running this imports from: every site-packages (its venv's,
    even one inside the checkout, the system's, the user's) and any other folder outside `root`
    (PYTHONPATH's), but not the checkout nor a folder of it. A path file only adds folders: the
    .pth files inside them (an editable install's finder) do not run in a side, and the side's
    own site-packages comes first."""
    inside = root.resolve()

    def wanted(p: Path) -> bool:
        site = p.name in ("site-packages", "dist-packages")
        return p.is_dir() and (site or not p.resolve().is_relative_to(inside))

    return [p for p in sys.path if p and wanted(Path(p))]


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
    (side.site_packages / DEPS_PTH).write_text("\n".join(dependency_paths(root)) + "\n")
    origin = side.run_python(
        f"import importlib.util as u; print(u.find_spec({PACKAGE!r}).origin)"
    ).strip()
    if not Path(origin).is_relative_to(side.site_packages):
        raise SideError(f"{PACKAGE} imports from {origin} in the side of {commit[:8]}")
    return side


FORK_PROBE = r"""
import os, sys
from asv_runner._aux import update_sys_path
from asv_runner.discovery import disc_benchmarks

root, device = sys.argv[1], sys.argv[2]
update_sys_path(root)
for _ in disc_benchmarks(root):  # what asv's forkserver imports before it forks
    pass
pid = os.fork()
if pid == 0:
    import torch

    try:
        torch.ones(1, device=device).sum().item()
        os._exit(0)
    except Exception as exc:
        print(f"{type(exc).__name__}: {exc}".splitlines()[0], file=sys.stderr, flush=True)
        os._exit(1)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""
# torch's documented switch: is_available() asks NVML, which leaves CUDA's driver alone in the
# process that forks (cudaGetDeviceCount, its default, spoils every later fork for CUDA).
NVML_CHECK = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}


# glibc's malloc with its heap on transparent huge pages (2 MB each, physically contiguous), for
# the gate's rounds: a tunable read at a process's start, so the gate sets it for asv and the
# processes it starts (glibc >= 2.35; with transparent huge pages on madvise, as on these VMs:
# "always" has them already, "never" none). One set on an idle 2-core VM, one thread, processes
# in turn, alternately without and with it: performer's forward at 1,024 tokens (the fastest
# sample of 1 s) read 14.4-17.5 ms (cv 5.7%) in 14 processes on 4 KB pages, 13.9-15.2 ms (cv 2.7%)
# in the 14 with huge pages. The likely cause: on 4 KB pages each process has its own scatter of
# physical pages, and with it its own cache conflicts.
HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb=1"


def huge_pages_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """GLIBC_TUNABLES with glibc's heap on transparent huge pages, after `environ`'s own tunables
    (unless those set glibc.malloc.hugetlb themselves: theirs stands)."""
    own = environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb=" in own:
        return {"GLIBC_TUNABLES": own}
    return {"GLIBC_TUNABLES": f"{own}:{HUGE_PAGES_TUNABLE}" if own else HUGE_PAGES_TUNABLE}


@dataclass(frozen=True)
class Launch:
    """How asv starts the benchmarks of a side: its launch method and environment variables."""

    method: str = "forkserver"
    env: dict[str, str] = field(default_factory=dict)
    why: str | None = None  # what the check found, when it is not plain forkserver


def fork_check(side: Side, benchmark_dir: Path, device: str, env: dict[str, str]) -> str | None:
    """None when a process forked after the suite's import (as asv's forkserver does) can use
    `device`; else the error it got."""
    proc = subprocess.run(
        [str(side.python), "-c", FORK_PROBE, str(benchmark_dir), device],
        capture_output=True,
        text=True,
        cwd=side.folder,
        env={**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, **env},
    )
    return None if proc.returncode == 0 else (proc.stderr.strip() or f"exit {proc.returncode}")


def launch_for(side: Side, benchmark_dir: Path, device: str) -> Launch:
    """asv's forkserver (the suite imported once, a fork per benchmark) where a forked process can
    use `device`; on CUDA else with torch's NVML check; else spawn (a fresh interpreter per
    benchmark: seconds each, always safe), saying why."""
    why = fork_check(side, benchmark_dir, device, {})
    if why is None:
        return Launch()
    if device == "cuda" and fork_check(side, benchmark_dir, device, NVML_CHECK) is None:
        return Launch("forkserver", NVML_CHECK, f"{why}; with {NVML_CHECK} it can")
    return Launch("spawn", {}, why)


def round_args(
    side: Side,
    conf_path: Path,
    machine: str,
    bench: Sequence[str],
    attributes: dict[str, str],
    launch: Launch,
) -> list[str]:
    """`asv run` arguments for one round on `side`: its own interpreter and discovery, results
    filed under its commit, samples appended to the rounds before."""
    args = ["run", "--config", str(conf_path), "--machine", machine]
    args += ["--environment", f"existing:{side.python}", "--set-commit-hash", side.commit]
    args += ["--append-samples", "--launch-method", launch.method, "--show-stderr"]
    for key, value in {"rounds": "1", **attributes}.items():
        args += ["-a", f"{key}={value}"]
    for regex in bench:
        args += ["--bench", regex]
    return args


def interleaved(sides: Sequence[Side], rounds: int) -> list[Side]:
    """The order of the rounds, ABAB then BABA: each side as often first as second (a drift of the
    machine weighs on both alike), and two rounds of one side adjacent once only (ABBA has a pair
    at every turn, so a disturbance lasting two rounds could fall on one side only)."""
    first, second = sides
    half = rounds // 2
    return [first, second] * (rounds - half) + [second, first] * half
