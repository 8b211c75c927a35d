"""The gate's judging: asv's measurements of two commits and the deterministic baselines turned
into regressions, notes and failures, each named with both numbers, the ratio and its limit."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import limits as time_limits  # sibling scripts
from plumbing import (
    Gate,
    GateError,
    Measurement,
    checked_out,
    ensure_machine,
    is_na,
    say,
    short,
)


def fmt(value: float, unit: str) -> str:
    from asv.util import human_value

    if unit == "seconds":
        return human_value(value, unit)
    whole = float(value).is_integer() or abs(value) >= 1000  # counts, bytes, FLOPs
    return f"{value:,.0f} {unit}" if whole else f"{value:.4g} {unit}"  # e.g. an approx_error


def exact_tolerance(benchmark: str) -> float | None:
    """The relative tolerance of a track_<metric> benchmark whose metric the catalogue calls
    deterministic (compared exactly); None for any other (shown, not judged)."""
    from attention_zoo.measure.metrics import METRICS

    method = benchmark.partition("(")[0].rsplit(".", 1)[-1]
    spec = METRICS.get(method.removeprefix("track_"))
    if spec is None or not spec.deterministic:
        return None
    return spec.tolerance or 0.0


def ratio_of(m: Measurement) -> float | None:
    """head / base of a benchmark measured on both commits, else None."""
    if m.base is None or m.head is None or is_na(m.base) or is_na(m.head):
        return None
    return m.head / m.base if m.base else math.inf if m.head else 1.0


def judge(
    rows: Sequence[Measurement], limits: time_limits.Limits
) -> tuple[list[str], list[str], list[str]]:
    """(regressions, notes, failures) as lines naming the benchmark, both values, the ratio and,
    for a time, its limit and the noise that limit was calibrated on."""
    regressions, notes, failures = [], [], []
    for m in rows:
        if m.head is None:
            failures.append(f"{m.benchmark}: failed on the head commit (asv's output above)")
            continue
        if m.base is None:
            notes.append(f"{m.benchmark}: failed on the base commit only, not compared")
            continue
        if is_na(m.base) or is_na(m.head):
            if is_na(m.base) != is_na(m.head):
                notes.append(f"{m.benchmark}: runs on one commit only, not compared")
            continue
        ratio = ratio_of(m)
        both = f"{fmt(m.base, m.unit)} before, {fmt(m.head, m.unit)} after: {ratio:.2f}x"
        if m.kind == "time":
            limit = limits.for_benchmark(m.benchmark)
            if ratio > limit.factor:
                regressions.append(
                    f"time {m.benchmark}: {both} > limit {limit.factor:.2f}x ({limit.source})"
                )
        elif (tol := exact_tolerance(m.benchmark)) is not None:
            if ratio > 1 + tol:
                regressions.append(f"{m.unit} {m.benchmark}: {both} (exact: tolerance {tol:.0%})")
            elif ratio < 1 - tol:
                notes.append(f"{m.benchmark}: {both}: less than before; was that intended?")
    return regressions, notes, failures


def compared(rows: Sequence[Measurement]) -> list[str]:
    """One line per benchmark measured on both commits: before, after, ratio."""
    lines = []
    for m in rows:
        if (ratio := ratio_of(m)) is None:
            continue
        lines.append(
            f"{fmt(m.base, m.unit):>16s} {fmt(m.head, m.unit):>16s} {ratio:6.2f}x  {m.benchmark}"
        )
    return lines


def baseline_differences(
    tree: Path, quick: bool, code: Path | None = None, cases: Sequence[str] = ()
) -> list[dict]:
    """The baseline check (update_baselines.py --check --json) of `tree`'s script and stored
    baselines, run on the code of `code` (default: the same tree): its difference records."""
    code = code or tree
    script = tree / "benchmarks" / "scripts" / "update_baselines.py"
    stored = tree / "benchmarks" / "baselines" / "deterministic.json"
    argv = [sys.executable, str(script), "--check", "--json", "--path", str(stored)]
    argv += ["--quick"] if quick else []
    for key in cases:
        argv += ["--case", key]
    path = os.pathsep.join(p for p in (str(code), os.environ.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        argv, cwd=code, env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True
    )
    diffs = None
    if proc.returncode in (0, 1):  # 1: a difference, but also Python's code for a crash
        with contextlib.suppress(json.JSONDecodeError):
            diffs = json.loads(proc.stdout)
    if diffs is None:
        why = f"exit {proc.returncode}" + (", no JSON" if proc.returncode in (0, 1) else "")
        raise GateError(
            f"the baseline check failed on {code.name} ({why}):\n"
            f"{proc.stdout[-1500:]}{proc.stderr[-3000:]}"
        )
    return diffs


def same_value(a: float, b: float, tolerance: float) -> bool:
    return abs(a - b) <= tolerance * max(abs(b), 1)


def attribute(
    head_diffs: Sequence[dict], base_diffs: Sequence[dict] | None, base: str
) -> tuple[list[str], list[str]]:
    """Split head's differences from the stored baselines by the commit that made them:
    (regressions of head, notes). `base_diffs`: the same check on the base commit's code for
    those cases (None: the base could not be checked, so head is blamed)."""
    on_base = {(d["key"], d["metric"]): d for d in base_diffs or ()}
    regressions, notes = [], []
    for d in head_diffs:
        line = f"baseline {d['message']}"
        b = on_base.get((d["key"], d["metric"]))
        if base_diffs is None or b is None:  # the base matches the stored value: head changed it
            (regressions if d["increase"] else notes).append(line)
        elif same_value(d["actual"], b["actual"], d["tolerance"]):
            notes.append(f"{line}: already in base {short(base)}, not this change")
        else:
            vs_base = d["actual"] / b["actual"] if b["actual"] else math.inf
            more = f"{line}; base {short(base)} has {b['actual']:,}: {vs_base:.3f}x of base"
            (regressions if vs_base > 1 else notes).append(more)
    return regressions, notes


def check_baselines(head: str, base: str, quick: bool) -> tuple[list[str], list[str]]:
    """The deterministic baselines on the head commit's code: (regressions, notes). A case that
    differs is checked on the base commit's code too (against head's stored baselines), so that
    a difference already in base is said to be, not blamed on head."""
    with checked_out(head) as head_tree:
        head_diffs = baseline_differences(head_tree, quick)
        if not head_diffs:
            return [], []
        keys = sorted({d["key"] for d in head_diffs})
        with checked_out(base) as base_tree:
            try:
                base_diffs = baseline_differences(head_tree, quick, base_tree, keys)
            except GateError as exc:
                say(f"the base commit's baselines could not be checked: {exc}")
                base_diffs = None
    return attribute(head_diffs, base_diffs, base)


def over_limit(rows: Sequence[Measurement], limits: time_limits.Limits) -> dict[str, float]:
    """The time benchmarks whose head/base ratio is above their limit, with that ratio."""
    return {
        m.benchmark: r
        for m in rows
        if m.kind == "time"
        and (r := ratio_of(m)) is not None
        and r > limits.for_benchmark(m.benchmark).factor
    }


@dataclass
class Verdict:
    """What a gate run found: its lines, the time rows compared and the benchmarks re-measured."""

    regressions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    rows: list[Measurement] = field(default_factory=list)
    remeasured: dict[str, float | None] = field(default_factory=dict)  # name: second ratio

    def as_json(self, limits: time_limits.Limits) -> dict:
        def row(m: Measurement) -> dict:
            limit = limits.for_benchmark(m.benchmark) if m.kind == "time" else None
            return {
                "benchmark": m.benchmark,
                "kind": m.kind,
                "unit": m.unit,
                "base": m.base,
                "head": m.head,
                "ratio": ratio_of(m),
                "limit": limit.factor if limit else None,
                "limit_source": limit.source if limit else None,
            }

        return {
            "regressions": self.regressions,
            "notes": self.notes,
            "failures": self.failures,
            "rows": [row(m) for m in self.rows if ratio_of(m) is not None],
            "remeasured": self.remeasured,
        }


def time_verdict(gate: Gate, base: str, head: str, limits: time_limits.Limits) -> Verdict:
    """Compare, then re-measure the time benchmarks over their limit in a second interleaved run
    with twice the rounds: a regression is one that is over the limit both times (a load spike
    rarely lasts that long; a slower code path always does)."""
    args = gate.args
    ensure_machine(args.machine)
    result = gate.compare(base, head, args.bench, args.rounds)
    if not any(not (is_na(m.base) and is_na(m.head)) for m in result.rows):
        raise GateError("no benchmark matched --bench or none could run here")
    say(f"time comparison done (asv's output: {result.log})")
    print(f"\ngate: {'before':>16s} {'after':>16s} {'ratio':>7s}  benchmark")
    for line in compared(result.rows):
        print(f"gate: {line}")
    verdict = Verdict(*judge(result.rows, limits), rows=result.rows)
    if elsewhere := limits.calibrated_elsewhere(args.machine, time_limits.this_cpu()):
        say(f"note: {elsewhere}")
        verdict.notes.insert(0, elsewhere)
    flagged = over_limit(result.rows, limits)
    if not flagged or args.no_confirm or verdict.failures:
        return verdict
    rounds = 2 * args.rounds
    say(f"re-measuring {len(flagged)} time benchmark(s) over their limit in {rounds} rounds")
    bench = [f"^{re.escape(name)}$" for name in flagged]
    again = gate.compare(base, head, bench, rounds)
    still = over_limit(again.rows, limits)
    verdict.remeasured = {m.benchmark: ratio_of(m) for m in again.rows if m.benchmark in flagged}
    kept_lines = []
    for line in verdict.regressions:
        name = next((n for n in flagged if line.startswith(f"time {n}:")), None)
        if name is None:
            kept_lines.append(line)
        elif name in still:
            kept_lines.append(f"{line}; re-measured: {still[name]:.2f}x")
        elif not verdict.remeasured.get(name):  # no second number: it cannot be cleared
            verdict.failures.append(
                f"{name}: {flagged[name]:.2f}x over its limit, and its re-measure gave no result"
            )
        else:
            verdict.notes.append(
                f"{name}: {flagged[name]:.2f}x, re-measured {verdict.remeasured[name]:.2f}x: "
                "noise, not a regression"
            )
    verdict.regressions = kept_lines
    return verdict
