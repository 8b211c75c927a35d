"""Which timings read busy, and who used the cores meanwhile: `zoo bench` run in this process with
every timing window attributed (this process, other processes by name, kernel threads, steal and
interrupts, and what no process accounts for), then each case's mark as the bench table and the
report give it.

    python benchmarks/scripts/busy_probe.py                 # the quick preset by the wall clock
    python benchmarks/scripts/busy_probe.py --cold --twice  # a first run (page cache of the
                                                            # packages dropped), then a rerun
    python benchmarks/scripts/busy_probe.py -- --preset quick --backends sdpa,lsh  # other flags

On an idle machine every run should end with `0 busy` in both rules; a window that reads busy lists
what took the cores. Timings are the machine's: run it where nothing else runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from attention_zoo.cli import main as zoo_main
from attention_zoo.measure import load, trust
from attention_zoo.measure.table import _marks, group_cases
from attention_zoo.report.frame import case_frame
from attention_zoo.store import ResultStore

STATES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
HZ = os.sysconf("SC_CLK_TCK")
KTHREAD = 0x00200000  # PF_KTHREAD in /proc/PID/stat's flags


def cpu_states() -> list[int]:
    """Jiffies per CPU state, summed over the CPUs this process may use."""
    cpus, out = load.allowed_cpus(), [0] * len(STATES)
    with open("/proc/stat") as f:
        for line in f:
            name, *values = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
                out = [a + int(b) for a, b in zip(out, values[: len(STATES)])]
    return out


def processes() -> dict[int, tuple[str, bool, int]]:
    """pid -> (name, kernel thread?, CPU jiffies so far) of every process this one can see."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                raw = f.read()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        name = raw[raw.index("(") + 1 : raw.rindex(")")]
        out[int(pid)] = (name, bool(int(fields[6]) & KTHREAD), int(fields[11]) + int(fields[12]))
    return out


def snapshot() -> tuple[list[int], dict, float, float]:
    return cpu_states(), processes(), time.process_time(), time.perf_counter()


def attribute(a: tuple, b: tuple) -> dict:
    """Cores used between two snapshots, by whom."""
    wall = b[3] - a[3]
    states = [y - x for x, y in zip(a[0], b[0])]
    total = sum(states) or 1
    cores = len(load.allowed_cpus())

    def share(jiffies: float) -> float:
        return jiffies / total * cores

    machine = share(total - states[3] - states[4])
    own = (b[2] - a[2]) / wall
    others: dict[str, float] = {}
    kernel = 0.0
    for pid, (name, kthread, used) in b[1].items():
        if pid == os.getpid():
            continue
        delta = (used - a[1].get(pid, (name, kthread, 0))[2]) / HZ / wall
        if delta > 0:
            kernel += delta if kthread else 0
            key = f"{name}{' [kernel]' if kthread else ''}"
            others[key] = others.get(key, 0.0) + delta
    seen = sum(others.values())
    return {
        "wall": wall,
        "machine": machine,
        "own": own,
        "others": max(0.0, machine - own),
        "kernel threads": kernel,
        "steal": share(states[7]),
        "interrupts": share(states[5] + states[6]),
        "unaccounted": machine - own - seen,  # exited processes, interrupts, rounding
        "top": sorted(others.items(), key=lambda kv: -kv[1])[:3],
    }


def probe(zoo_args: list[str], store: Path) -> list[dict]:
    """Run `zoo bench ZOO_ARGS --store STORE` here; the windows of its timings, in order."""
    windows: list[dict] = []
    real = trust.read_cpu
    pending: list[tuple] = []

    def read_cpu() -> load.CpuReading | None:
        reading, snap = real(), snapshot()
        if pending:
            windows.append(attribute(pending.pop(), snap))
        else:
            pending.append(snap)
        return reading

    trust.read_cpu = read_cpu
    try:
        code = zoo_main(["bench", *zoo_args, "--store", str(store)])
    finally:
        trust.read_cpu = real
    if code not in (0, 1):  # 1: a case failed, stored as such; its windows still count
        raise SystemExit(f"zoo bench exited {code}")
    return windows


def drop_page_cache(packages: list[str]) -> int:
    """Evict the installed packages' files from the page cache (as after a reboot); files other
    processes map stay. Returns how many files were advised."""
    count = 0
    for name in packages:
        module = __import__(name)
        for path in Path(module.__file__).parent.rglob("*"):
            if path.is_file():
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
                count += 1
    return count


def report(store: Path, windows: list[dict]) -> None:
    with ResultStore(store, write=False) as s:
        rows, runs = s.rows(), s.runs()
    run = runs[-1]
    frame = case_frame(rows, runs)
    cases = {c["case_key"]: c for c in group_cases(rows)}
    timed = frame[[("time_median" in m) for m in frame["metrics"]]]
    table_busy = [
        k for k in timed["case_key"] if any(m.kind == trust.BUSY for m in _marks(cases[k]))
    ]
    report_busy = [k for k, b in zip(timed["case_key"], timed["busy"]) if b]
    own = [k for k, m in zip(timed["case_key"], timed["metrics"]) if "free_cores" in m]
    print(f"\nrun {run['run_id']}: load at start {run['load_start']}, at end {run['load_end']} "
          f"on {run['cpu_count']} cores")  # fmt: skip
    print(f"{len(timed)} timed cases, {len(own)} with a reading of their own; busy: "
          f"{len(table_busy)} in the bench table, {len(report_busy)} in the report")  # fmt: skip
    print(f"{'window':>6} {'wall s':>7} {'machine':>7} {'own':>5} {'others':>6} {'kernel':>6} "
          f"{'steal':>5} {'irq':>5} {'unacc.':>6}  top others")  # fmt: skip
    for i, w in enumerate(windows):
        top = ", ".join(f"{n} {c:.2f}" for n, c in w["top"])
        print(f"{i:>6} {w['wall']:>7.3f} {w['machine']:>7.2f} {w['own']:>5.2f} {w['others']:>6.2f} "
              f"{w['kernel threads']:>6.2f} {w['steal']:>5.2f} {w['interrupts']:>5.2f} "
              f"{w['unaccounted']:>6.2f}  {top}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--cold", action="store_true", help="drop the packages' page cache first")
    p.add_argument("--twice", action="store_true", help="run again at once (a first run, a rerun)")
    p.add_argument("zoo_args", nargs="*", help="zoo bench flags (after --)")
    args = p.parse_args(argv)
    # the wall clock: the preset's CPU clock reads no timing window (the load cannot inflate it)
    zoo_args = args.zoo_args or ["--preset", "quick", "--clock", "wall", "--no-progress"]
    if args.cold:
        print(f"dropped from the page cache: {drop_page_cache(['torch', 'attention_zoo'])} files")
    with tempfile.TemporaryDirectory() as tmp:
        for attempt in range(2 if args.twice else 1):
            store = Path(tmp) / f"probe-{attempt}.sqlite"
            report(store, probe(zoo_args, store))
    return 0


if __name__ == "__main__":
    sys.exit(main())
