"""Checks the `zoo` subcommands share, all run before any work starts: devices, output paths, and
flags that conflict or do nothing (argparse types for numbers and lists: argtypes.py).
Each failure is a one-line message saying what is wrong and what would work."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import UnavailableError, UsageError, did_you_mean
from ..paths import require_folder, require_writable
from ..store import is_ours


class DeprecatedAlias(argparse.Action):
    """An old spelling of a flag: stores into the new flag's dest and prints a note once."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, new: str, **kw: Any) -> None:
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kw)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(
            f"{parser.prog}: note: {option_string} is deprecated; use {self.new}", file=sys.stderr
        )
        setattr(namespace, self.dest, values)


# ---- devices ------------------------------------------------------------------------------------

DEVICE_FORM = re.compile(r"^(cpu|meta|auto|cuda(:\d+)?)$")


def check_device(
    device: str, *, flag: str, present: bool, allow: Iterable[str] = ("cpu", "cuda")
) -> str:
    """`device` if it names one of `allow` ('cuda' covers cuda:N); present: it must exist here."""
    allowed = list(allow)
    kind = device.split(":", 1)[0]
    if not DEVICE_FORM.match(device) or kind not in allowed:
        forms = ", ".join(a + (", cuda:N" if a == "cuda" else "") for a in allowed)
        raise UsageError(f"{flag} {device!r}: unknown device; use {forms}")
    if present and kind == "cuda":
        if not torch.cuda.is_available():
            why = (
                "this torch build has no CUDA"
                if torch.version.cuda is None
                else "no CUDA device is visible"
            )
            raise UnavailableError(
                f"{flag} {device}: CUDA is not available here ({why}, torch {torch.__version__}); "
                f"use {flag} cpu"
            )
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            raise UnavailableError(
                f"{flag} {device}: there are {torch.cuda.device_count()} CUDA device(s) here "
                f"(cuda:0..cuda:{torch.cuda.device_count() - 1})"
            )
    return device


# ---- flags that conflict or do nothing ---------------------------------------------------------


def given(args: argparse.Namespace, dest: str) -> bool:
    """True when the flag with this dest was set on the command line (defaults are None/False)."""
    value = getattr(args, dest, None)
    return value is not None and value is not False and value != []


def reject_together(args: argparse.Namespace, a: str, b: str, reason: str) -> None:
    """UsageError when both flags (dests a and b) are given."""
    if given(args, a) and given(args, b):
        raise UsageError(f"{_flag(a)} and {_flag(b)} cannot be combined: {reason}")


def require(args: argparse.Namespace, flag: str, needs: str, reason: str) -> None:
    """UsageError when `flag` is given without `needs`."""
    if given(args, flag) and not given(args, needs):
        raise UsageError(f"{_flag(flag)} needs {_flag(needs)}: {reason}")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


# ---- output paths ----------------------------------------------------------


def check_output_file(path: str, flag: str) -> Path:
    """A file the command may (over)write: its folder exists and takes new files."""
    out = Path(path)
    if out.is_dir():
        raise UsageError(f"{flag} {path} is a folder; give a file name such as {out / 'out.csv'}")
    require_folder(out.parent, f"{flag} {path}")
    require_writable(out.parent, f"{flag} {path}")
    if out.exists() and not os.access(out, os.W_OK):
        raise UsageError(f"{flag} {path}: the file is not writable")
    if out.is_file() and is_ours(out):
        raise UsageError(f"{flag} {path} is a results store; give another file name")
    return out


def check_output_folder(path: str, flag: str, *, default: bool) -> Path:
    """A folder the command writes into: created if missing (its parent must exist unless this is
    the default), refused if it is a file or does not take new files."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{flag} {path} is a file; give a folder (it will be created)")
    if not out.exists():
        if not default:
            require_folder(out.parent, f"{flag} {path}")
        probe = next((p for p in [out, *out.parents] if p.exists()), Path.cwd())
    else:
        probe = out
    require_writable(probe, f"{flag} {path}")
    return out


def check_reference(
    reference: str | None,
    backends: Iterable[str],
    fix: str = "add it to --backends or pick one of them",
) -> None:
    """An explicit --reference must be one of `backends` (or a peer family of them, 'hf' for
    hf:lsh), else every ratio would be '-'; `fix`: what the command can do about it."""
    if reference is None:
        return
    benched = sorted(set(backends))
    families = sorted({b.split(":", 1)[0] for b in benched if ":" in b})
    if reference in benched or reference in families:
        return
    raise UsageError(
        f"--reference {reference!r} is not among the benchmarked backends ({', '.join(benched)})"
        + (f" or peer families ({', '.join(families)})" if families else "")
        + f"; {fix}"
        + did_you_mean(reference, benched + families)
    )
