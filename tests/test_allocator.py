"""The suite's steady allocator: blocks freed in a step stay mapped for the next one (no fresh page
faults inside a timed step). glibc's defaults do that or not depending on the process's history."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

# Three 20 MB tensors made and freed per step, as full attention's scores at 1,024 tokens are:
# prints the minor page faults of five steps after two warm ones. "unmapped": every such block
# from mmap, returned on free (the control: this script sees fresh pages when there are some).
STEPS = """
import ctypes, resource, sys, torch
from benchmarks.allocator import steady_allocator
torch.set_num_threads(1)
if sys.argv[1] == "steady":
    assert steady_allocator()
else:
    assert ctypes.CDLL(None).mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD: 1 MB
def step():
    kept = [torch.ones(5 << 20) for _ in range(3)]
    del kept
step(); step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
ROOT = Path(__file__).resolve().parents[1]


def faults(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", STEPS, mode], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return int(out.stdout.split()[-1])


# Never called in this process: its thresholds would stay for every later test.
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the C library is not glibc")
def test_steady_allocator_keeps_freed_blocks_mapped() -> None:
    unmapped, steady = faults("unmapped"), faults("steady")
    # relative: a page is 4 KiB here, 2 MiB where transparent huge pages are always on
    assert steady * 4 < unmapped, f"{steady} page faults in 5 steps, {unmapped} with mmap"
