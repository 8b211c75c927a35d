"""The regression gate: time through asv on two commits, memory and FLOPs exactly (baselines).

    python benchmarks/scripts/gate.py                  # merge base with main vs HEAD, whole suite
    python benchmarks/scripts/gate.py --fast           # CI's subset: attention cores + one block
    python benchmarks/scripts/gate.py --base HEAD~1 --bench 'Time.time_forward\\(.*local'
    python benchmarks/scripts/gate.py --head worktree  # uncommitted changes vs the merge base
    python benchmarks/scripts/gate.py --calibrate 10   # noise: HEAD against a copy of itself
    python benchmarks/scripts/gate.py --fast --comment gate.md \
        --report-summary results/report/summary.md     # the verdict and the report's summary as
                                                       # Markdown: a PR comment, CI's artifact

Time: `asv continuous` builds both commits into one virtualenv and runs the selected benchmarks in
`--rounds` rounds interleaved across the commits (ABBA), at one torch thread (the suite's `threads`
parameter), each round taking more samples than asv's default (SAMPLING). A time benchmark regresses
when its median grows by more than TIME_FACTOR, the smallest factor that never fired in repeated
runs of a commit against itself (`--calibrate`), in the comparison and again when the gate
re-measures it at once with twice the rounds (a load spike rarely lasts).
Deterministic metrics (the metric catalogue says which) regress on any increase beyond their
tolerance: asv's track_<metric> results, and the baselines (benchmarks/baselines/) checked on the
head commit.
Exit codes: 0 no regression, 1 a regression (each named with both numbers and the ratio),
2 the gate could not decide (bad configuration, unknown revision, build or benchmark failure,
a crashing baseline check).
asv's own exit code mixes the last two, so the verdict is read from its stored results.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIME_FACTOR = 1.16  # head/base median ratio above it is a regression; from `--calibrate 10 --fast`
DEFAULT_ROUNDS = 4
# Per round: 5 to 25 samples within 5 s, after 0.5 s of warm-up; each sample is one call after a
# fresh setup (the suite's setup hooks). asv's default, up to 5 samples after 0.1 s, let a brief
# load spike move a 2 ms benchmark's median by 13% between identical commits; at least 5 samples
# is never fewer than asv takes. Passed to asv for the gate's comparisons only: published results
# keep asv's defaults. TIME_FACTOR was calibrated with exactly this.
SAMPLING = {"repeat": "(5,25,5.0)", "warmup_time": "0.5"}
BLOCK_TIME_REGEX = r"^bench_blocks\.ResidualLayers\.time_train_step\('cpu', 1, 'reversible', 2\)$"


def core_time_regex(backends: Sequence[str] = ()) -> str:
    """asv's names of the attention cores' forward and forward+backward times at 1,024 tokens on
    one CPU thread, for `backends` (default: every one)."""
    names = "|".join(re.escape(b) for b in backends) or "[^']+"
    params = rf"\('cpu', 1, 'attention', '({names})', 1024, 'forward(\+backward)?'\)"
    return rf"^bench_attention\.Time\.time_step{params}$"


# CI's subset: every attention core, and one block variant (a reversible 2-layer model step).
FAST_BENCH = [core_time_regex(), BLOCK_TIME_REGEX]
GATE_DIR = Path(".asv") / "gate"  # the gate's own config and results, apart from the published ones
OK, REGRESSION, ERROR = 0, 1, 2


class GateError(Exception):
    """The gate could not decide: exit code 2."""


_START = time.monotonic()


def say(message: str) -> None:
    """A line of the gate's own, with the seconds since it started."""
    print(f"gate [{time.monotonic() - _START:6.0f}s]: {message}", flush=True)


# ---- git -------------------------------------------------------------------------------------


def git(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise GateError(f"git {' '.join(args)} failed: {proc.stderr.strip() or proc.stdout}")
    return proc.stdout.strip()


def commit_of(rev: str) -> str | None:
    out = git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
    return out or None


def short(commit: str) -> str:
    return git("log", "-1", "--format=%h %s", commit)[:72]


@contextlib.contextmanager
def kept(commit: str, name: str) -> Iterator[str]:
    """Keep a scratch commit reachable (a ref under refs/zoo-gate/) while the gate uses it."""
    ref = f"refs/zoo-gate/{name}"
    git("update-ref", ref, commit)
    try:
        yield commit
    finally:
        git("update-ref", "-d", ref, check=False)


def snapshot_worktree() -> str:
    """A commit of the working tree's tracked files (uncommitted changes included), or HEAD."""
    return git("stash", "create") or git("rev-parse", "HEAD")


def same_tree_commit(commit: str) -> str:
    """A new commit with `commit`'s tree and `commit` as parent: the same code under another hash,
    so that asv measures a commit against itself as two."""
    return git(
        "commit-tree", f"{commit}^{{tree}}", "-p", commit, "-m", "gate calibration: same tree"
    )


def resolve_base(base: str | None, head: str, missing_base_ok: bool) -> str | None:
    """The base commit: `base`, else the merge base of head and main (head's parent when head is
    on main). None (with a message) when it is not in this clone and missing_base_ok."""
    if base is None:
        main = commit_of("main") or commit_of("origin/main")
        merge_base = git("merge-base", head, main, check=False) if main else ""
        base = merge_base if merge_base and merge_base != head else f"{head}~1"
    found = commit_of(base)
    if found is None and git("rev-parse", "--is-shallow-repository") == "true":
        git("fetch", "--quiet", "--deepen=1", check=False)  # a shallow clone: fetch one more
        found = commit_of(base)
    if found is None:
        why = (
            f"{base} is not in this clone (first commit, or history not fetched: "
            f"git fetch --unshallow)"
        )
        if missing_base_ok:
            say(f"nothing to compare against: {why}; skipped")
            return None
        raise GateError(why)
    return found


# ---- asv -------------------------------------------------------------------------------------


def load_asv_config(path: Path) -> dict:
    """asv.conf.json as asv reads it (JSON with // comments); GateError when it is not usable."""
    from asv.util import load_json

    try:
        conf = load_json(str(path), api_version=1, js_comments=True)
    except Exception as exc:
        raise GateError(f"{path} is not a valid asv configuration: {exc}") from None
    for key in ("repo", "benchmark_dir", "env_dir", "html_dir", "matrix", "build_command"):
        if key not in conf:
            raise GateError(f"{path} has no {key!r}: the gate builds commits with asv")
    return conf


def gate_config(conf: dict, env_dir: Path | None = None) -> Path:
    """The project's asv configuration with the gate's own results directory (published results
    stay untouched by comparisons of scratch commits). asv reads paths relative to the
    configuration file, so they are made absolute."""
    results = ROOT / GATE_DIR / "results"
    shutil.rmtree(results, ignore_errors=True)  # a stale result must never be read as this run's
    paths = {key: str(ROOT / conf[key]) for key in ("repo", "benchmark_dir", "env_dir", "html_dir")}
    if env_dir is not None:
        paths["env_dir"] = str(env_dir.resolve())
    gate = {**conf, **paths, "version": 1, "results_dir": str(results)}
    path = ROOT / GATE_DIR / "asv.conf.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(gate, indent=1))
    return path


def asv(*args: str, echo: bool = True) -> tuple[int, str]:
    """Run an asv command from the repository root, streaming its output; (exit code, output)."""
    cmd = [sys.executable, "-m", "asv", *args]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if echo:
            print(line, end="", flush=True)
    return proc.wait(), "".join(lines)


def ensure_machine(machine: str) -> None:
    """Record this machine for asv (its CPU, memory, OS) under `machine` if it is not yet."""
    code, out = asv("machine", "--yes", "--machine", machine, echo=False)
    if code != 0:
        raise GateError(f"asv machine failed:\n{out[-2000:]}")


@dataclass(frozen=True)
class Measurement:
    benchmark: str  # asv's name with parameters, as its table prints it
    kind: str  # asv's type: time or track
    unit: str
    base: float | None  # None: failed; nan: n/a (skipped)
    head: float | None


def load_results(results_dir: Path, machine: str, base: str, head: str) -> list[Measurement]:
    """Every selected benchmark's value on both commits, read from asv's stored results."""
    from asv.results import iter_results_for_machine_and_hash

    index = results_dir / "benchmarks.json"
    if not index.exists():
        raise GateError("asv stored no benchmark list: discovery failed (see its output above)")
    benchmarks = {k: v for k, v in json.loads(index.read_text()).items() if k != "version"}
    found = {}
    for commit in (base, head):
        runs = list(iter_results_for_machine_and_hash(str(results_dir), machine, commit))
        if not runs:
            raise GateError(f"asv stored no results for {commit[:8]} (see its output above)")
        found[commit] = runs[0]
    rows = []
    for name, bench in sorted(benchmarks.items()):
        combos = (
            [f"{name}({', '.join(c)})" for c in itertools.product(*bench["params"])]
            if bench["params"]
            else [name]
        )
        if not any(name in res.get_all_result_keys() for res in found.values()):
            continue  # not selected
        values: dict[str, list[float | None]] = {}
        for commit, res in found.items():
            ran = name in res.get_all_result_keys()
            got = res.get_result_value(name, bench["params"]) if ran else None
            values[commit] = got if got is not None else [None] * len(combos)
        for i, label in enumerate(combos):
            rows.append(
                Measurement(label, bench["type"], bench["unit"], values[base][i], values[head][i])
            )
    return rows


# ---- verdict ---------------------------------------------------------------------------------


def fmt(value: float, unit: str) -> str:
    from asv.util import human_value

    return human_value(value, unit) if unit == "seconds" else f"{value:,.0f} {unit}"


def is_na(value: float | None) -> bool:
    return value is not None and math.isnan(value)


def exact_tolerance(benchmark: str) -> float | None:
    """The relative tolerance of a track_<metric> benchmark whose metric the catalogue calls
    deterministic (compared exactly); None for any other (shown, not judged)."""
    from attention_zoo.measure.metrics import METRICS

    method = benchmark.partition("(")[0].rsplit(".", 1)[-1]
    spec = METRICS.get(method.removeprefix("track_"))
    if spec is None or not spec.deterministic:
        return None
    return spec.tolerance or 0.0


def judge(rows: Sequence[Measurement], factor: float) -> tuple[list[str], list[str], list[str]]:
    """(regressions, notes, failures) as lines naming the benchmark, both values and the ratio."""
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
        ratio = m.head / m.base if m.base else math.inf if m.head else 1.0
        both = f"{fmt(m.base, m.unit)} before, {fmt(m.head, m.unit)} after: {ratio:.2f}x"
        if m.kind == "time":
            if ratio > factor:
                regressions.append(f"time {m.benchmark}: {both} (limit {factor:.2f}x)")
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
        if m.base is None or m.head is None or is_na(m.base) or is_na(m.head):
            continue
        ratio = m.head / m.base if m.base else math.nan
        lines.append(
            f"{fmt(m.base, m.unit):>16s} {fmt(m.head, m.unit):>16s} {ratio:6.2f}x  {m.benchmark}"
        )
    return lines


def check_baselines(head: str, quick: bool) -> tuple[list[str], list[str]]:
    """The deterministic baselines on the head commit's code: (increases, other differences);
    `quick`: only the representative cases of the quick test pass."""
    with tempfile.TemporaryDirectory(prefix="zoo-gate-") as tmp:
        tree = Path(tmp) / "head"
        git("worktree", "add", "--detach", "--quiet", str(tree), head)
        try:
            proc = subprocess.run(
                [
                    sys.executable,
                    "benchmarks/scripts/update_baselines.py",
                    "--check",
                    "--json",
                    *(["--quick"] if quick else []),
                ],
                cwd=tree,
                env={**os.environ, "PYTHONPATH": str(tree)},
                capture_output=True,
                text=True,
            )
        finally:
            git("worktree", "remove", "--force", str(tree), check=False)
    diffs = None
    if proc.returncode in (0, 1):  # 1: a difference, but also Python's code for a crash
        with contextlib.suppress(json.JSONDecodeError):
            diffs = json.loads(proc.stdout)
    if diffs is None:
        why = f"exit {proc.returncode}" + (", no JSON" if proc.returncode in (0, 1) else "")
        raise GateError(
            f"the baseline check failed on {head[:8]} ({why}):\n"
            f"{proc.stdout[-1500:]}{proc.stderr[-3000:]}"
        )
    more = [d["message"] for d in diffs if d["increase"]]
    other = [d["message"] for d in diffs if not d["increase"]]
    return more, other


# ---- one comparison and the calibration -----------------------------------------------------


@dataclass
class Comparison:
    rows: list[Measurement]
    asv_output: str


def compare(
    conf_path: Path,
    machine: str,
    base: str,
    head: str,
    bench: Sequence[str],
    rounds: int,
    factor: float,
    echo: bool = True,
) -> Comparison:
    """asv continuous base head (interleaved rounds), then both commits' stored results."""
    args = ["continuous", "--config", str(conf_path), "--machine", machine]
    args += ["--interleave-rounds", "-a", f"rounds={rounds}", "--factor", str(factor)]
    for key, value in SAMPLING.items():
        args += ["-a", f"{key}={value}"]
    args += ["--no-stats", "--sort", "ratio", "--show-stderr"]
    for regex in bench:
        args += ["--bench", regex]
    code, out = asv(*args, base, head, echo=echo)
    if "BENCHMARKS" not in out:  # asv prints its verdict line only when it got to compare
        raise GateError(f"asv continuous stopped (exit {code}) before comparing:\n{out[-3000:]}")
    rows = load_results(ROOT / GATE_DIR / "results", machine, base, head)
    return Comparison(rows=rows, asv_output=out)


def calibrate(args: argparse.Namespace, conf_path: Path, head: str) -> int:
    """Run the comparison `args.calibrate` times on head against a copy of itself; print each
    time benchmark's largest ratio and the smallest factor that would not have fired."""
    worst: dict[str, float] = {}
    with kept(same_tree_commit(head), "calibration") as twin:
        for i in range(args.calibrate):
            say(f"calibration run {i + 1}/{args.calibrate}")
            # alternate which copy is "base": commit order cannot bias the result
            base, new = (twin, head) if i % 2 else (head, twin)
            result = compare(conf_path, args.machine, base, new, args.bench, args.rounds, 1e9)
            run_worst = (0.0, "")
            for m in result.rows:
                if m.kind != "time" or m.base is None or m.head is None:
                    continue
                if is_na(m.base) or is_na(m.head) or not m.base:
                    continue
                ratio = max(m.head / m.base, m.base / m.head)
                worst[m.benchmark] = max(worst.get(m.benchmark, 0.0), ratio)
                run_worst = max(run_worst, (ratio, m.benchmark))
            say(f"calibration run {i + 1}: largest ratio {run_worst[0]:.3f}x ({run_worst[1]})")
    if not worst:
        raise GateError("no time benchmark produced a result in the calibration runs")
    print(f"\nlargest ratio between identical commits in {args.calibrate} runs (either way):")
    for name, ratio in sorted(worst.items(), key=lambda kv: -kv[1]):
        print(f"  {ratio:6.3f}x  {name}")
    suggested = math.ceil(max(worst.values()) * 100) / 100
    print(f"suggested time factor (never fired in these runs): {suggested:.2f}")
    print(f"current TIME_FACTOR in benchmarks/scripts/gate.py: {TIME_FACTOR}")
    return OK


# ---- command line ----------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--base", help="commit to compare against (default: merge base with main; on main: HEAD~1)"
    )
    parser.add_argument(
        "--head",
        default="HEAD",
        help="commit to test (default: HEAD); 'worktree' = the working tree's tracked files",
    )
    parser.add_argument(
        "--bench",
        action="append",
        default=[],
        help="asv benchmark regex, matched against name(params); repeatable (default: all)",
    )
    parser.add_argument(
        "--fast", action="store_true", help="CI's subset (FAST_BENCH): cores and one block"
    )
    parser.add_argument(
        "--factor",
        type=float,
        default=TIME_FACTOR,
        help="time ratio above which a benchmark regresses (default: %(default)s)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=DEFAULT_ROUNDS,
        help="asv rounds, interleaved across the two commits (default: %(default)s)",
    )
    parser.add_argument("--no-baselines", action="store_true", help="skip the baseline check")
    parser.add_argument(
        "--no-confirm",
        action="store_true",
        help="do not re-measure time benchmarks over the factor (one run decides)",
    )
    parser.add_argument("--no-time", action="store_true", help="only the baseline check")
    parser.add_argument(
        "--missing-base-ok",
        action="store_true",
        help="exit 0 when the base commit is not in this clone (first commit, shallow clone)",
    )
    parser.add_argument(
        "--calibrate",
        type=int,
        metavar="N",
        help="run the comparison N times on head against a copy of itself; print the noise",
    )
    parser.add_argument(
        "--machine", default=platform.node() or "local", help="asv machine name (default: host)"
    )
    parser.add_argument(
        "--config", type=Path, default=ROOT / "asv.conf.json", help="asv configuration"
    )
    parser.add_argument(
        "--env-dir",
        type=Path,
        help="where asv keeps its environments (default: the configuration's env_dir); "
        "another clone's saves building one",
    )
    parser.add_argument(
        "--comment",
        type=Path,
        help="also write the verdict as Markdown to this file: a pull-request comment, the "
        "artifact CI posts",
    )
    parser.add_argument(
        "--report-summary",
        type=Path,
        help="a report's summary.md (zoo report writes it beside report.md) to put under the "
        "verdict in --comment",
    )
    args = parser.parse_args(argv)
    if args.report_summary and not args.comment:
        parser.error("--report-summary goes into --comment: give both")
    if args.fast:
        args.bench = [*args.bench, *FAST_BENCH]
    if args.rounds < 2:
        parser.error("--rounds must be >= 2 (rounds are what is interleaved)")
    if args.factor <= 1:
        parser.error("--factor must be > 1")
    if args.calibrate is not None and (args.calibrate < 1 or args.no_time):
        parser.error("--calibrate needs N >= 1 and the time comparison (no --no-time)")
    return args


def slower(rows: Sequence[Measurement], factor: float) -> dict[str, float]:
    """The time benchmarks whose head/base ratio is above `factor`, with that ratio."""
    return {
        m.benchmark: m.head / m.base
        for m in rows
        if m.kind == "time"
        and m.base
        and m.head is not None
        and not (is_na(m.base) or is_na(m.head))
        and m.head / m.base > factor
    }


def time_verdict(
    args: argparse.Namespace, conf_path: Path, base: str, head: str
) -> tuple[list[str], list[str], list[str]]:
    """Compare, then re-measure the time benchmarks over the factor in a second interleaved run
    with twice the rounds: a regression is one that is over the factor both times (a load spike
    rarely lasts that long; a slower code path always does)."""
    ensure_machine(args.machine)
    result = compare(conf_path, args.machine, base, head, args.bench, args.rounds, args.factor)
    if not any(not (is_na(m.base) and is_na(m.head)) for m in result.rows):
        raise GateError("no benchmark matched --bench or none could run here")
    say("time comparison done")
    print(f"\ngate: {'before':>16s} {'after':>16s} {'ratio':>7s}  benchmark")
    for line in compared(result.rows):
        print(f"gate: {line}")
    regressions, notes, failures = judge(result.rows, args.factor)
    flagged = slower(result.rows, args.factor)
    if not flagged or args.no_confirm or failures:
        return regressions, notes, failures
    rounds = 2 * args.rounds
    say(f"re-measuring {len(flagged)} time benchmark(s) over {args.factor:.2f}x in {rounds} rounds")
    bench = [f"^{re.escape(name)}$" for name in flagged]
    again = compare(conf_path, args.machine, base, head, bench, rounds, args.factor)
    still = slower(again.rows, args.factor)
    ratios = {m.benchmark: m.head / m.base for m in again.rows if m.benchmark in flagged}
    kept_lines = []
    for line in regressions:
        name = next((n for n in flagged if line.startswith(f"time {n}:")), None)
        if name is None:
            kept_lines.append(line)
        elif name in still:
            kept_lines.append(f"{line}; re-measured: {still[name]:.2f}x")
        else:
            second = f"{ratios[name]:.2f}x" if name in ratios else "no result"
            notes.append(
                f"{name}: {flagged[name]:.2f}x, re-measured {second}: noise, not a regression"
            )
    return kept_lines, notes, failures


def run(args: argparse.Namespace) -> int:
    conf_path = None if args.no_time else gate_config(load_asv_config(args.config), args.env_dir)
    head_name = args.head
    head = snapshot_worktree() if head_name == "worktree" else commit_of(head_name)
    if head is None:
        raise GateError(f"unknown revision {head_name!r}")
    with kept(head, "head"):
        if args.calibrate:
            ensure_machine(args.machine)
            return calibrate(args, conf_path, head)
        base = resolve_base(args.base, head, args.missing_base_ok)
        if base is None:
            write_comment(args, "skipped: no base commit in this clone to compare against", [], [])
            return OK
        if base == head:
            raise GateError(f"base and head are the same commit ({head[:8]}): nothing to compare")
        say(f"base {short(base)}")
        say(f"head {short(head)}")
        regressions, notes, failures = [], [], []
        if not args.no_time:
            regressions, notes, failures = time_verdict(args, conf_path, base, head)
        if not args.no_baselines:
            say("checking the deterministic baselines on the head commit")
            more, other = check_baselines(head, quick=args.fast)
            say("baseline check done")
            regressions += [f"baseline {line}" for line in more]
            notes += [f"baseline {line}" for line in other]
    print()
    for line in notes:
        print(f"gate: note: {line}")
    if failures:
        raise GateError("benchmark(s) failed:\n  " + "\n  ".join(failures))
    if regressions:
        print(f"gate: REGRESSION ({len(regressions)}):")
        for line in regressions:
            print(f"  {line}")
        write_comment(args, f"REGRESSION ({len(regressions)})", regressions, notes)
        return REGRESSION
    verdict = f"no regression (time limit {args.factor:.2f}x; memory and FLOPs exact)"
    print(f"gate: {verdict}")
    write_comment(args, verdict, [], notes)
    return OK


def write_comment(
    args: argparse.Namespace, verdict: str, regressions: Sequence[str], notes: Sequence[str]
) -> None:
    """The verdict as Markdown in --comment, with the report's summary.md under it if given."""
    if not args.comment:
        return
    lines = [f"**Regression gate: {verdict}**", ""]
    lines += [f"- {line}" for line in regressions]
    if notes:
        lines += ["", "<details><summary>notes</summary>", ""]
        lines += [f"- {line}" for line in notes] + ["", "</details>"]
    if args.report_summary:
        summary = args.report_summary.read_text() if args.report_summary.is_file() else ""
        lines += ["", summary or f"(no report summary at {args.report_summary})"]
    args.comment.write_text("\n".join(lines).rstrip() + "\n")
    say(f"comment written to {args.comment}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except GateError as exc:
        print(f"gate: error: {exc}", file=sys.stderr)
    except Exception:  # a bug or an unexpected asv/git state is still "could not decide"
        traceback.print_exc()
        print("gate: error: unexpected failure (traceback above)", file=sys.stderr)
    return ERROR


if __name__ == "__main__":
    sys.exit(main())
