"""A steady CPU allocator for timing: glibc malloc with fixed thresholds, not its dynamic ones.

glibc serves a large block from mmap (fresh pages, faulted and zeroed on first touch: system time
inside the step) or from its heap (pages already mapped), and moves the threshold between the two
with the process's history of frees. Two processes running the same code then time the same step
up to 1.3x apart (full attention at 1,024 tokens: 69 ms against 90 ms of CPU time). Fixed
thresholds make every block below MMAP_THRESHOLD come from a heap that is never trimmed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

MMAP_THRESHOLD = 32 << 20  # bytes: glibc's largest allowed value (64-bit)
TRIM_THRESHOLD = 2**31 - 1  # bytes, mallopt's largest (an int): freed heap memory stays mapped
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)


@functools.cache
def steady_allocator() -> bool:
    """Fix glibc malloc's mmap and trim thresholds in this process (and the processes it forks
    after this). False where the C library is not glibc: nothing changes there."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
