"""How much memory a case may use here: the smallest of the RAM available, the address-space
limit (RLIMIT_AS) and the cgroup's memory limit, and which of them it was. The "auto" memory
limit is a share of it; an isolated worker's own limit never exceeds what it inherited."""

from __future__ import annotations

import resource
from dataclasses import dataclass
from pathlib import Path

AUTO_FRACTION = 0.9  # the "auto" limit's share of the memory this process may still use
_UNLIMITED = 2**62  # cgroup v1 writes "no limit" as a page-rounded 2**63 - 1
RAM, RLIMIT_AS, CGROUP = "available RAM", "RLIMIT_AS", "cgroup limit"
V1_LIMIT = "memory.limit_in_bytes"  # cgroup v1's name for v2's memory.max


@dataclass(frozen=True)
class MemoryCeiling:
    """Bytes this process may still allocate, and the limit that sets it."""

    bytes: int
    source: str  # RAM, RLIMIT_AS or CGROUP (with the file it was read from)


def vm_size_bytes() -> int:
    """This process's address space now (VmSize)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise OSError("VmSize not in /proc/self/status")


def available_ram() -> int | None:
    """MemAvailable from /proc/meminfo, or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def address_space_headroom() -> int | None:
    """What RLIMIT_AS leaves above this process's address space now; None when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        return max(0, soft - vm_size_bytes())
    except OSError:
        return soft


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (v2): no limit


def cgroup_headroom(
    proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")
) -> tuple[int, str] | None:
    """(limit - usage, the limit's file) of the tightest memory limit of this process's cgroup
    and its ancestors: cgroup v2 memory.max, v1 memory.limit_in_bytes; None without one."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    found = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2, unified
            folders, limit, usage = root, "memory.max", "memory.current"
        elif "memory" in controllers.split(","):  # v1
            folders, limit, usage = root / "memory", V1_LIMIT, "memory.usage_in_bytes"
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts) + 1):  # the cgroup and its ancestors (a container: "/")
            folder = folders.joinpath(*parts[:depth])
            cap, used = _read_int(folder / limit), _read_int(folder / usage)
            if cap is not None and cap < _UNLIMITED:
                found.append((max(0, cap - (used or 0)), str(folder / limit)))
    return min(found) if found else None


def memory_ceiling() -> MemoryCeiling | None:
    """The smallest of available RAM, RLIMIT_AS's headroom and the cgroup's; None if none known."""
    candidates = []
    if (ram := available_ram()) is not None:
        candidates.append(MemoryCeiling(ram, RAM))
    if (space := address_space_headroom()) is not None:
        candidates.append(MemoryCeiling(space, RLIMIT_AS))
    if (group := cgroup_headroom()) is not None:
        candidates.append(MemoryCeiling(group[0], f"{CGROUP} ({group[1]})"))
    return min(candidates, key=lambda c: c.bytes) if candidates else None


def auto_memory_limit() -> MemoryCeiling | None:
    """The "auto" memory limit: AUTO_FRACTION of memory_ceiling(), with its source."""
    ceiling = memory_ceiling()
    return MemoryCeiling(int(ceiling.bytes * AUTO_FRACTION), ceiling.source) if ceiling else None


def capped(limit: int) -> int:
    """`limit` lowered to this process's RLIMIT_AS (soft and hard) where one is set: a process
    may lower its limits but not raise them."""
    bounds = [b for b in resource.getrlimit(resource.RLIMIT_AS) if b != resource.RLIM_INFINITY]
    return min([limit, *bounds])
