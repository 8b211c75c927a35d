"""The suite's steady CPU allocator: glibc malloc with fixed thresholds, not its dynamic ones.

glibc serves a large block from mmap (fresh pages, faulted and zeroed on first touch: system time
inside the step) or from its heap (pages already mapped), and moves the threshold between the two
with the process's history of frees. Six processes of one commit timed full attention at 1,024
tokens at 80 to 97 ms of CPU time; with fixed thresholds, 69 to 71 ms: every block below
MMAP_THRESHOLD comes from a heap that is never trimmed. Part of the suite, not of the package, so
both sides of a gate comparison time under it, whatever their commit. The gate's rounds also put
that heap on transparent huge pages where glibc (>= 2.35) and the kernel offer them, a setting
read at a process's start (benchmarks/scripts/sides.py).
"""

from __future__ import annotations

import ctypes
import functools

MMAP_THRESHOLD = 32 << 20  # bytes: glibc's largest allowed value (64-bit)
TRIM_THRESHOLD = 2**31 - 1  # bytes, mallopt's largest (an int): freed heap memory stays mapped
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)


@functools.cache
def steady_allocator() -> bool:
    """Fix glibc malloc's mmap and trim thresholds in this process (and the processes it forks
    after this). False where the C library is not glibc: nothing changes there."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own symbols: glibc's where it is
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
