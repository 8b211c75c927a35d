"""The steady allocator: blocks freed in a step stay mapped for the next one (no fresh page faults
inside a timed step). glibc's defaults do that or not depending on the process's history."""

from __future__ import annotations

import subprocess
import sys

import pytest

from attention_zoo.measure.allocator import steady_allocator

# Three 20 MB tensors made and freed per step, as full attention's scores at 1,024 tokens are:
# prints the minor page faults of five steps after two warm ones. "unmapped": every such block
# from mmap, returned on free (the control: this script sees fresh pages when there are some).
STEPS = """
import ctypes, resource, sys, torch
from attention_zoo.measure.allocator import steady_allocator
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
TENSOR_PAGES = (20 << 20) // 4096


def faults(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", STEPS, mode], capture_output=True, text=True, check=True
    )
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not steady_allocator(), reason="the C library is not glibc")
def test_steady_allocator_keeps_freed_blocks_mapped() -> None:
    unmapped, steady = faults("unmapped"), faults("steady")
    assert unmapped >= 5 * 3 * TENSOR_PAGES, f"the control faulted only {unmapped} pages"
    assert steady < 5 * TENSOR_PAGES // 2, f"{steady} page faults in 5 steps ({unmapped} unmapped)"
