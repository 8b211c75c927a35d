"""The gate's acceptance runs, on an idle machine: in a scratch clone of HEAD, `--runs` gate runs
on an unchanged commit, on a planted slowdown of the local core (its kernel runs `--slowdown`
times as long) and on a planted growth of its memory (`--growth` times its peak), then a table.

    python benchmarks/scripts/acceptance.py                     # --fast, 5 runs each (5 to 7 min
                                                                # a run on 2 idle cores; README)
    python benchmarks/scripts/acceptance.py --calibrate 10      # first the noise, written to this
                                                                # checkout's time-limits.json
    python benchmarks/scripts/acceptance.py --runs 1 --bench 'Time.time_step.*attention.*local'
    python benchmarks/scripts/acceptance.py --device cuda --runs 1 --scenario unchanged \
        --scenario slowdown --slowdown 1.25                    # the GPU check's STEPS=gate

Targets: unchanged, every benchmark within 1.05x either way, exit 0 and no re-measure in every
run; the slowdown and the growth flagged (exit 1 naming the local core) in every run. Exit 0 when
all were met, 1 otherwise. Nothing in this checkout changes but, with --calibrate, its
time-limits.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gate  # sibling scripts
import limits as time_limits
import plants
import plumbing

SCENARIOS = ("unchanged", "slowdown", "growth")
UNCHANGED_LIMIT = 1.05  # the target: an unchanged commit reads at most this in every run


@dataclass(frozen=True)
class Scenario:
    name: str
    source: str  # appended to the local core's module ("" = an empty commit)
    flagged: bool  # what the gate must say


@dataclass(frozen=True)
class Outcome:
    scenario: str
    run: int
    exit: int
    largest: float | None  # the time ratio (head / base) furthest from 1x, either way
    largest_name: str
    flagged: list[str]  # the regressions, each up to its numbers (kind and benchmark or case)
    remeasured: int
    seconds: float

    def met(self, scenario: Scenario) -> bool:
        if not scenario.flagged:
            small = self.largest is not None and deviation(self.largest) <= UNCHANGED_LIMIT
            return self.exit == gate.OK and small and not self.remeasured
        return self.exit == gate.REGRESSION and any("local" in f for f in self.flagged)


def what(regression: str) -> str:
    """A regression line up to its numbers: the benchmark, or the baseline case and metric."""
    parts = regression.split(": ")
    return ": ".join(parts[:2] if regression.startswith("baseline") else parts[:1])


def deviation(ratio: float) -> float:
    """How far a ratio is from 1x, either way, as a ratio >= 1."""
    return max(ratio, 1 / ratio)


def sh(*args: str, cwd: Path) -> str:
    return subprocess.run(args, cwd=cwd, check=True, capture_output=True, text=True).stdout


def scratch_clone(folder: Path) -> Path:
    """A clone of this checkout's HEAD, tagged `accept-start`, with a committer."""
    repo = folder / "repo"
    sh(
        "git",
        "clone",
        "--quiet",
        "--no-hardlinks",
        str(plumbing.ROOT),
        str(repo),
        cwd=plumbing.ROOT,
    )
    sh("git", "checkout", "--quiet", "-B", "accept", plumbing.commit_of("HEAD"), cwd=repo)
    sh("git", "config", "user.email", "acceptance@gate", cwd=repo)
    sh("git", "config", "user.name", "gate acceptance", cwd=repo)
    sh("git", "tag", "--force", "accept-start", cwd=repo)
    return repo


def commit(repo: Path, scenario: Scenario) -> None:
    """The scenario as one commit on top of `accept-start`."""
    sh("git", "checkout", "--quiet", "--force", "-B", "accept", "accept-start", cwd=repo)
    if scenario.source:
        plants.plant(repo, scenario.source)
    sh("git", "commit", "--quiet", "--allow-empty", "-am", scenario.name, cwd=repo)


def run_gate(repo: Path, gate_args: Sequence[str], log: Path) -> dict:
    """One gate run in the clone (its output appended to `log`); what it found."""
    found = repo / ".asv" / "accept.json"
    found.unlink(missing_ok=True)
    argv = [sys.executable, "benchmarks/scripts/gate.py", "--base", "HEAD~1", "--json", str(found)]
    proc = subprocess.run([*argv, *gate_args], cwd=repo, capture_output=True, text=True)
    with log.open("a") as f:
        f.write(f"$ {' '.join(argv + list(gate_args))}\n{proc.stdout}{proc.stderr}\n")
    if not found.exists():
        return {"exit": proc.returncode, "rows": [], "regressions": [], "remeasured": {}}
    return json.loads(found.read_text())


def outcome(scenario: Scenario, run: int, found: dict, seconds: float) -> Outcome:
    times = [r for r in found["rows"] if r["kind"] == "time" and r["ratio"]]
    top = max(times, key=lambda r: deviation(r["ratio"]), default=None)
    return Outcome(
        scenario=scenario.name,
        run=run,
        exit=found["exit"],
        largest=top["ratio"] if top else None,
        largest_name=top["benchmark"] if top else "",
        flagged=[what(line) for line in found["regressions"]],
        remeasured=len(found["remeasured"]),
        seconds=seconds,
    )


def table(outcomes: Sequence[Outcome], scenarios: dict[str, Scenario]) -> list[str]:
    lines = [
        "| scenario | run | exit | time ratio furthest from 1x | flagged | re-measured | met | s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        largest = f"{o.largest:.3f}x {o.largest_name}" if o.largest is not None else "-"
        flagged = "; ".join(o.flagged) or "-"
        met = "yes" if o.met(scenarios[o.scenario]) else "NO"
        lines.append(
            f"| {o.scenario} | {o.run} | {o.exit} | {largest} | {flagged} | {o.remeasured} | "
            f"{met} | {o.seconds:.0f} |"
        )
    return lines


def _at_least_one(text: str) -> int:
    if not text.isdigit() or int(text) < 1:  # no run meets no target: nothing to accept
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return int(text)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--runs", type=_at_least_one, default=5, help="gate runs per scenario (default 5)"
    )
    parser.add_argument("--slowdown", type=float, default=1.25, help="planted time factor")
    parser.add_argument("--growth", type=float, default=2.0, help="planted memory factor")
    parser.add_argument(
        "--calibrate", type=int, metavar="N", help="first calibrate N runs (written here)"
    )
    parser.add_argument(
        "--bench", action="append", default=[], help="asv regex instead of --fast's subset"
    )
    parser.add_argument("--device", choices=gate.DEVICES, default="cpu")
    parser.add_argument(
        "--rounds", type=int, help="each gate run's --rounds (default: the gate's own choice)"
    )
    parser.add_argument(
        "--scenario",
        action="append",
        choices=SCENARIOS,
        help="only these scenarios (repeatable; default: all three)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch clone")
    parser.add_argument(
        "--log",
        type=Path,
        help="append every gate run's output here (default: in the clone's folder)",
    )
    args = parser.parse_args(argv)
    if args.rounds is not None and args.rounds < gate.MIN_ROUNDS:
        parser.error(f"--rounds must be >= {gate.MIN_ROUNDS} (what the gate interleaves)")
    if args.log is not None and not args.log.parent.is_dir():
        parser.error(f"--log {args.log}: its folder does not exist")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    subset = (
        [f"--bench={b}" for b in args.bench] + ["--quick-baselines"] if args.bench else ["--fast"]
    )
    gate_args = [*subset, "--device", args.device]
    gate_args += ["--rounds", str(args.rounds)] if args.rounds else []
    from attention_zoo.measure import baseline

    (case,) = [c for c in baseline.quick_cases() if c.backend == "local"]
    peak = baseline.load()["cases"][case.key()]["tracked_peak_bytes"]
    planted = {
        "unchanged": Scenario("unchanged", "", flagged=False),
        "slowdown": Scenario(f"local {args.slowdown}x slower", plants.slower(args.slowdown), True),
        "growth": Scenario(
            f"local {args.growth}x memory", plants.hungrier(int((args.growth - 1) * peak)), True
        ),
    }
    wanted = args.scenario or SCENARIOS
    scenarios = {s.name: s for key, s in planted.items() if key in wanted}
    folder = Path(tempfile.mkdtemp(prefix="zoo-acceptance-"))
    log = args.log or folder / "gate.log"
    outcomes: list[Outcome] = []
    try:
        repo = scratch_clone(folder)
        print(f"acceptance: scratch clone {repo}; every gate run's output in {log}", flush=True)
        limits = folder / time_limits.PATH.name  # outside the clone: checkouts keep it
        if time_limits.PATH.is_file():  # a calibration keeps the other benchmarks' entries
            shutil.copy(time_limits.PATH, limits)
        if args.calibrate:
            commit(repo, planted["unchanged"])
            argv = [sys.executable, "benchmarks/scripts/gate.py", "--calibrate"]
            argv += [str(args.calibrate), *gate_args, "--limits", str(limits)]
            subprocess.run(argv, cwd=repo, check=True)
            shutil.copy(limits, time_limits.PATH)
            print(f"acceptance: calibrated limits written to {time_limits.PATH}", flush=True)
        gate_args += ["--limits", str(limits)]
        for scenario in scenarios.values():
            commit(repo, scenario)
            for run in range(1, args.runs + 1):
                started = time.monotonic()
                found = run_gate(repo, gate_args, log)
                o = outcome(scenario, run, found, time.monotonic() - started)
                outcomes.append(o)
                print(table([o], scenarios)[-1], flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    print("\n".join(["", *table(outcomes, scenarios)]))
    met = {
        name: sum(o.met(s) for o in outcomes if o.scenario == name) for name, s in scenarios.items()
    }
    for name, count in met.items():
        print(f"acceptance: {name}: met in {count} of {args.runs} runs")
    return 0 if all(count == args.runs for count in met.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
