"""Resource limits respected: the auto memory limit is the smallest of RAM, RLIMIT_AS and the
cgroup limit (and says which), isolated workers never raise a limit they inherited."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from attention_zoo.measure import limits

HARD_AS = 6_000_000_000  # the address-space cap of the probe that failed every isolated case


def test_cgroup_v2_limit_is_the_tightest_of_the_group_and_its_ancestors(tmp_path: Path) -> None:
    (tmp_path / "proc").write_text("0::/user.slice/job\n")
    job = tmp_path / "cg" / "user.slice" / "job"
    job.mkdir(parents=True)
    (job / "memory.max").write_text("1073741824\n")
    (job / "memory.current").write_text("268435456\n")
    (job.parent / "memory.max").write_text("max\n")  # no limit above it
    free, where = limits.cgroup_headroom(tmp_path / "proc", tmp_path / "cg")
    assert free == 1073741824 - 268435456 and where == str(job / "memory.max")


def test_cgroup_v1_limit_and_its_no_limit_value(tmp_path: Path) -> None:
    (tmp_path / "proc").write_text("5:cpu,cpuacct:/\n4:memory:/docker/abc\n")
    group = tmp_path / "cg" / "memory" / "docker" / "abc"
    group.mkdir(parents=True)
    (group / "memory.limit_in_bytes").write_text("2147483648\n")
    (group / "memory.usage_in_bytes").write_text("1073741824\n")
    assert limits.cgroup_headroom(tmp_path / "proc", tmp_path / "cg")[0] == 1073741824
    (group / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    assert limits.cgroup_headroom(tmp_path / "proc", tmp_path / "cg") is None


def test_a_worker_limit_never_exceeds_what_it_inherited(monkeypatch) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _: (HARD_AS, HARD_AS))
    assert limits.capped(20 * 2**30) == HARD_AS and limits.capped(2**30) == 2**30


def _hard_address_space_limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (HARD_AS, HARD_AS))


@pytest.mark.slow
@pytest.mark.long
def test_isolated_bench_under_a_hard_address_space_limit(tmp_path: Path) -> None:
    """Before: every isolated case failed with 'current limit exceeds maximum limit'."""
    argv = ["bench", "--backends", "full", "--lengths", "128", "--modes", "forward",
            "--metrics", "time,memory", "--repeats", "1", "--budget", "0", "--threads", "1",
            "--isolate", "--store", str(tmp_path / "s.sqlite"), "--no-progress"]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "attention_zoo", *argv],
        capture_output=True,
        text=True,
        preexec_fn=_hard_address_space_limit,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "set by RLIMIT_AS" in proc.stderr  # the auto limit says which limit it used
    assert "1 ok" in proc.stdout and "exceeds maximum limit" not in proc.stdout
