"""The suite's steady allocator: blocks below its mmap threshold come from glibc's heap (pages
already mapped), where glibc's defaults may serve them from fresh mmap pages, faulted inside a
timed step. Read from glibc's own accounting (mallinfo2: bytes in mmapped blocks)."""

from __future__ import annotations

import platform
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


def mmapped(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", ALIVE, mode], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return int(out.stdout.split()[-1])


# Never called in this process: its thresholds would stay for every later test.
@pytest.mark.skipif(
    LIBC != "glibc" or tuple(map(int, LIBC_VERSION.split(".")[:2])) < (2, 33),
    reason="needs glibc >= 2.33 (mallinfo2)",
)
def test_steady_allocator_serves_large_blocks_from_the_heap() -> None:
    assert mmapped("unmapped") >= 20 << 20  # the control: the tensor's block was mmapped
    assert mmapped("steady") == 0
