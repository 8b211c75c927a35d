"""The environment every stored number carries: attention-zoo's version and git commit, torch
version, device name, threads, host, CUDA runtime and driver. Captured in the process that measured
the number (a Ray worker on another machine records its own)."""

from __future__ import annotations

import functools
import platform
import re
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ..version import __version__

_REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, kw_only=True)
class Environment:
    """Where and with what a number was measured."""

    git_commit: str  # HEAD of the attention-zoo checkout, "+dirty" with local changes, or "unknown"
    zoo_version: str = ""  # the attention-zoo package version: the fact that remains outside git
    torch_version: str
    device_name: str  # CPU model name or CUDA device name
    threads: int  # torch intra-op threads
    python: str = platform.python_version()
    host: str = platform.node()
    cuda_version: str = ""  # CUDA runtime torch was built with; "" without CUDA
    driver_version: str = ""  # NVIDIA driver; "" without one
    # torch.backends.cuda.matmul.allow_tf32 on CUDA (float32 matmuls rounded to TF32: which peak
    # a float32 rate is a share of, measure/peaks.py); None elsewhere
    cuda_matmul_tf32: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@functools.cache
def git_commit(repo: Path = _REPO) -> str:
    """HEAD of `repo` (+dirty when tracked files changed), or "unknown" outside a git checkout."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            check=False,
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=10,
        )
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            check=False,
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def zoo_version() -> str:
    """The version of the attention-zoo code running (the package's __version__)."""
    return __version__


@functools.cache
def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def device_name(device: str | torch.device = "cpu") -> str:
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return "cuda (not available)"
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        return cpu_name()
    return device.type


@functools.cache
def nvidia_driver_version() -> str:
    """The loaded NVIDIA kernel driver's version (from /proc), or "" where there is none."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            first = f.readline()
    except OSError:
        return ""
    match = re.search(r"Kernel Module\s+(?:for \S+\s+)?([0-9][0-9.]+)", first)
    return match.group(1) if match else first.strip()


def capture(device: str | torch.device = "cpu", threads: int | None = None) -> Environment:
    """The environment of this process now, for `device`; threads default to
    torch.get_num_threads()."""
    on_cuda = torch.device(device).type == "cuda"
    return Environment(
        git_commit=git_commit(),
        zoo_version=zoo_version(),
        torch_version=torch.__version__,
        device_name=device_name(device),
        threads=threads if threads is not None else torch.get_num_threads(),
        host=platform.node(),
        cuda_version=(torch.version.cuda or "") if on_cuda else "",
        driver_version=nvidia_driver_version() if on_cuda else "",
        cuda_matmul_tf32=bool(torch.backends.cuda.matmul.allow_tf32) if on_cuda else None,
    )
