"""The suite's steady allocator: blocks below its mmap threshold come from glibc's heap (pages
already mapped), where glibc's defaults may serve them from fresh mmap pages, faulted inside a
timed step. Read from glibc's own accounting (mallinfo2: bytes in mmapped blocks). The gate's
rounds also put that heap on transparent huge pages (sides.huge_pages_env): read from the
kernel's (AnonHugePages)."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

# Prints the bytes glibc holds in mmapped blocks while a 20 MB tensor is alive, less before.
# "unmapped": a 1 MB threshold (the control: this script sees an mmapped block when there is one).
ALIVE = """
import ctypes, sys, torch
from benchmarks.allocator import steady_allocator
class Info(ctypes.Structure):
    names = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
    _fields_ = [(n, ctypes.c_size_t) for n in names.split()]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
if sys.argv[1] == "steady":
    assert steady_allocator()
else:
    assert libc.mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD: 1 MB
before = libc.mallinfo2().hblkhd
kept = torch.ones(5 << 20)
print(libc.mallinfo2().hblkhd - before)
"""
ROOT = Path(__file__).resolve().parents[1]
LIBC, LIBC_VERSION = platform.libc_ver()
sys.path.insert(0, str(ROOT / "benchmarks" / "scripts"))
import sides  # noqa: E402  (scripts, importable from their folder)


def glibc_at_least(major: int, minor: int) -> bool:
    return LIBC == "glibc" and tuple(map(int, LIBC_VERSION.split(".")[:2])) >= (major, minor)


def child_reading(script: str, *argv: str, env: dict[str, str] | None = None) -> int:
    """The last integer `script` prints, run in a fresh interpreter (glibc's settings are per
    process); `env` replaces the environment's GLIBC_TUNABLES when given."""
    if env is not None:
        env = {**{k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}, **env}
    out = subprocess.run(
        [sys.executable, "-c", script, *argv],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env=env,
    )
    return int(out.stdout.split()[-1])


# Never called in this process: its thresholds would stay for every later test.
@pytest.mark.slow
@pytest.mark.skipif(not glibc_at_least(2, 33), reason="needs glibc >= 2.33 (mallinfo2)")
def test_steady_allocator_serves_large_blocks_from_the_heap() -> None:
    assert child_reading(ALIVE, "unmapped") >= 20 << 20  # the control: the block was mmapped
    assert child_reading(ALIVE, "steady") == 0


# Prints the kB of the process's memory on transparent huge pages while a 20 MB tensor from the
# steady allocator's heap is alive and written.
ON_HUGE_PAGES = """
import re, torch
from benchmarks.allocator import steady_allocator
assert steady_allocator()
kept = torch.ones(5 << 20)
print(re.search(r"AnonHugePages:\\s+(\\d+)", open("/proc/self/smaps_rollup").read()).group(1))
"""
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
THP_MODE = m.group(1) if THP.exists() and (m := re.search(r"\[(\w+)\]", THP.read_text())) else ""


@pytest.mark.slow
@pytest.mark.skipif(
    not glibc_at_least(2, 35) or THP_MODE != "madvise",
    reason="needs glibc >= 2.35 (glibc.malloc.hugetlb) and transparent huge pages on madvise",
)
def test_the_gates_rounds_put_the_heap_on_huge_pages() -> None:
    assert (
        child_reading(ON_HUGE_PAGES, env={}) == 0
    )  # the control: on madvise, nothing asks for huge pages
    assert child_reading(ON_HUGE_PAGES, env=sides.huge_pages_env({})) >= 2048
    mixed = sides.huge_pages_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
    assert mixed == {"GLIBC_TUNABLES": f"glibc.malloc.arena_max=2:{sides.HUGE_PAGES_TUNABLE}"}
    own = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}
    assert sides.huge_pages_env(own) == own  # a caller's own choice stands
