"""The gate's time limits, calibrated: per processor and benchmark, the largest ratio between
two identical commits over the runs of `gate.py --calibrate N`, and the limit drawn from it (twice
that noise above 1x); stored with the baselines, in benchmarks/baselines/time-limits.json.

The gate reads the limits calibrated on its own processor: two kinds of machine differ in noise.
On a processor never calibrated it takes each benchmark's loosest limit over those that were, and
says so. A benchmark that was not calibrated gets the largest limit of those calibrated on its
device (its own noise is unknown: the loosest limit keeps noise from failing a build), so a 1.25x
slowdown of an uncalibrated benchmark, or of one whose own noise puts its limit above 1.25x, can
pass; every flagged line names its limit and where it comes from, and `--calibrate N` tightens
them. With none calibrated, the gate says its limit is the uncalibrated default.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

PATH = Path(__file__).resolve().parents[1] / "baselines" / "time-limits.json"
MARGIN = 2.0  # the limit sits this many times the calibrated noise above 1x
# No limit below this: a few runs under-sample the noise's tail (of three unchanged runs, one read a
# benchmark 1.63x and the others under 1.2x); a 1.25x slowdown is still flagged at it.
FLOOR = 1.10
# The limit where nothing was calibrated on the device: the factor the wall-time gate before the
# clean sides was calibrated to (ten runs, 2 idle cores); `--calibrate` replaces it, --factor too.
UNCALIBRATED = 1.16


@dataclass(frozen=True)
class Limit:
    """A time benchmark's limit and where it comes from, in words a report can print."""

    factor: float
    source: str


def device_of(name: str) -> str | None:
    """The device parameter of an asv benchmark name with parameters (None: it has none)."""
    found = re.search(r"\('(cpu|cuda)'", name)
    return found.group(1) if found else None


def from_noise(noise: float) -> float:
    """The limit for a benchmark whose identical commits differed by up to `noise` (a ratio)."""
    return max(FLOOR, math.ceil(round((1 + MARGIN * (noise - 1)) * 100, 6)) / 100)


class Limits:
    """Per-benchmark limits read from the calibration file (or one factor for all)."""

    def __init__(self, entries: Mapping[str, dict], factor: float | None = None) -> None:
        self.entries = dict(entries)
        self.factor = factor

    @classmethod
    def load(cls, path: Path = PATH, cpu: str | None = None) -> Limits:
        """The limits calibrated on processor `cpu` (default: this machine's); on one never
        calibrated, each benchmark's loosest over the processors that were."""
        groups = _processors(path)
        cpu = cpu or this_cpu()
        if cpu in groups:
            return cls(groups[cpu])
        loosest: dict[str, dict] = {}
        for entries in groups.values():
            for name, entry in entries.items():
                if name not in loosest or entry["limit"] > loosest[name]["limit"]:
                    loosest[name] = entry
        return cls(loosest)

    @classmethod
    def uniform(cls, factor: float) -> Limits:
        return cls({}, factor)

    @property
    def rounds(self) -> int | None:
        """The rounds a side these limits were calibrated with, where every entry records the
        same (None: not recorded, or mixed): noise, and so a limit, holds for its sampling."""
        found = {entry.get("rounds") for entry in self.entries.values()}
        return found.pop() if len(found) == 1 else None

    def calibrated_elsewhere(self, machine: str, cpu: str) -> str | None:
        """A note when no limit was calibrated on this machine (matched by the processor an
        entry records, else by its machine name): another machine's noise is not this one's."""
        if self.factor is not None or not self.entries:
            return None
        found = self.entries.values()
        if any((e["cpu"] == cpu) if e.get("cpu") else e.get("machine") == machine for e in found):
            return None
        where = sorted({e.get("machine", "?") + _processor(e) for e in found})
        return (
            f"the time limits were calibrated on {', '.join(where)}, not on this machine "
            f"({machine}, {cpu}); each benchmark takes its loosest of them, which may still flag "
            "noise here as a slowdown or miss one; calibrate "
            "them where the gate runs (a CI runner too) with `python benchmarks/scripts/gate.py "
            "--calibrate 3` and commit benchmarks/baselines/time-limits.json"
        )

    def for_benchmark(self, name: str) -> Limit:
        if self.factor is not None:
            return Limit(self.factor, "--factor")
        entry = self.entries.get(name)
        if entry is not None:
            return Limit(
                entry["limit"],
                f"calibrated: largest {entry['noise']:.3f}x in {entry['runs']} unchanged "
                f"runs on {entry['machine']}{_processor(entry)}, {entry['date']}",
            )
        same = [e["limit"] for n, e in self.entries.items() if device_of(n) == device_of(name)]
        if same:
            return Limit(max(same), "not calibrated: the largest calibrated limit on its device")
        return Limit(
            UNCALIBRATED,
            "uncalibrated default (gate.py --calibrate N writes benchmarks/baselines/"
            "time-limits.json)",
        )


def this_cpu() -> str:
    """This machine's processor and core count, as a calibration records where it ran."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), name
            )
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores"


def write(
    worst: Mapping[str, float],
    runs: int,
    machine: str,
    commit: str,
    path: Path = PATH,
    cpu: str | None = None,
    rounds: int | None = None,
) -> Limits:
    """Store the limits drawn from a calibration's largest ratios under the machine's processor
    (cpu, default: this one's), with the rounds a side it ran, keeping the entries of other
    benchmarks (another device's, an earlier calibration's) and of other processors; returns this
    processor's limits."""
    cpu = cpu or this_cpu()
    groups = _processors(path)
    entries = groups.setdefault(cpu, {})
    when = {
        "runs": runs,
        "machine": machine,
        "cpu": cpu,
        "commit": commit[:12],
        "date": time.strftime("%F"),
        **({"rounds": rounds} if rounds else {}),
    }
    for name, noise in worst.items():
        entries[name] = {"noise": round(noise, 4), "limit": from_noise(noise), **when}
    _write(groups, path)
    return Limits(entries)


def combine(paths: Sequence[Path], into: Path) -> dict[str, dict[str, dict]]:
    """Merge calibration files of one sampling (the same plumbing.SAMPLING and TIME_QUANTILE)
    into `into`: per processor and benchmark, the largest noise, the runs of its distinct
    calibrations summed, and the newest one's commit and date. A merged entry lists the commits
    of the calibrations in it, so merging it again with one of them counts that one once;
    ValueError where two entries share only some of their calibrations."""
    merged: dict[str, dict[str, dict]] = {}
    for path in paths:
        for cpu, entries in _processors(path).items():
            for name, entry in entries.items():
                kept = merged.setdefault(cpu, {}).get(name)
                if kept is None:
                    merged[cpu][name] = {**entry, "commits": _calibrations(entry)}
                    continue
                ours, theirs = set(kept["commits"]), set(_calibrations(entry))
                if theirs <= ours:
                    continue  # every calibration of it is in already
                if kept.get("rounds") != entry.get("rounds"):
                    raise ValueError(
                        f"{path}: {name} on {cpu} was calibrated with {entry.get('rounds')} "
                        f"rounds a side, another file's with {kept.get('rounds')}: merge only "
                        "calibrations of one sampling"
                    )
                if ours & theirs:
                    raise ValueError(
                        f"{path}: {name} on {cpu} shares some calibrations with another file "
                        "but not all; merge the files the calibrations wrote"
                    )
                newest = entry if entry["date"] >= kept["date"] else kept  # ties: the later file
                noise = max(kept["noise"], entry["noise"])
                merged[cpu][name] = {
                    **newest,
                    "noise": noise,
                    "limit": from_noise(noise),
                    "runs": kept["runs"] + entry["runs"],
                    "commits": sorted(ours | theirs),
                }
    for entries in merged.values():
        for entry in entries.values():
            if len(entry["commits"]) == 1:
                del entry["commits"]  # one calibration: its commit says it
    _write(merged, into)
    return merged


def _calibrations(entry: dict) -> list[str]:
    """The commits of the calibrations an entry holds (more than one where it was merged)."""
    return entry.get("commits", [entry["commit"]])


def _write(groups: Mapping[str, Mapping[str, dict]], path: Path) -> None:
    about = (
        "Time limits of benchmarks/scripts/gate.py, written by gate.py --calibrate N: per "
        "processor and benchmark, noise = the largest ratio (either way) between a commit and a "
        f"copy of itself over N runs, limit = 1 + {MARGIN} * (noise - 1), rounded up to 0.01, at "
        f"least {FLOOR}"
    )
    processors = {c: dict(sorted(e.items())) for c, e in sorted(groups.items())}
    path.write_text(json.dumps({"about": about, "processors": processors}, indent=1) + "\n")


def _processor(entry: dict) -> str:
    """ " (its processor)" where the entry records one."""
    return f" ({entry['cpu']})" if entry.get("cpu") else ""


def _processors(path: Path) -> dict[str, dict[str, dict]]:
    """The calibration file's entries by processor (none: no file)."""
    if not path.is_file():
        return {}
    return json.loads(path.read_text())["processors"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Merge calibration files written by gate.py --calibrate with one sampling "
        "(two sessions' runs on one machine): per benchmark the largest noise, the runs summed."
    )
    parser.add_argument("files", nargs="+", type=Path, help="calibration files to merge")
    parser.add_argument("--into", type=Path, default=PATH, help="where (default: %(default)s)")
    args = parser.parse_args(argv)
    if missing := [str(f) for f in args.files if not f.is_file()]:
        parser.error(f"no such file: {', '.join(missing)}")
    try:
        merged = combine(args.files, args.into)
    except ValueError as err:
        parser.exit(2, f"limits.py: {err}\n")
    for cpu, entries in merged.items():
        top = max(entries.values(), key=lambda e: e["noise"])
        runs = sorted({e["runs"] for e in entries.values()})
        print(f"{cpu}: {len(entries)} benchmarks, runs {runs}, largest noise {top['noise']}x")
    print(f"wrote {args.into}: review the diff and commit it with the baselines")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
