"""The regression gate: time through asv on two commits, memory and FLOPs exactly (baselines).

    python benchmarks/scripts/gate.py                  # merge base with main vs HEAD, whole suite
    python benchmarks/scripts/gate.py --fast           # CI's subset: attention cores + one block
    python benchmarks/scripts/gate.py --fast --device cuda   # the same subset on the GPU
    python benchmarks/scripts/gate.py --base HEAD~1 --bench 'Time.time_step\\(.*local'
    python benchmarks/scripts/gate.py --fast --before-code-change   # CI: the latest code change
    python benchmarks/scripts/gate.py --head worktree  # uncommitted changes vs the merge base
    python benchmarks/scripts/gate.py --calibrate 10   # noise: HEAD against a copy of itself,
                                                       # and the limits drawn from it (written to
                                                       # benchmarks/baselines/time-limits.json)
    python benchmarks/scripts/gate.py --fast --comment gate.md \
        --report-summary results/report/summary.md     # the verdict and the report's summary as
                                                       # Markdown: a PR comment, CI's artifact

Time: each commit gets a clean environment of its own, built for this run (benchmarks/scripts/
sides.py), and asv runs the selected benchmarks in `--rounds` rounds per commit (by default the
rounds its limits were calibrated with), interleaved (ABAB then BABA: sides.interleaved), at one
torch thread (the suite's `threads` parameter), with glibc's heap on transparent huge pages
where glibc and the kernel offer them (sides.huge_pages_env), each round sampling for 0.4 s
(plumbing.SAMPLING). A time benchmark regresses when the 10th percentile of its samples over all
rounds (plumbing.gate_time) grows beyond its limit, calibrated by `--calibrate` and stored in
benchmarks/baselines/time-limits.json (benchmarks/scripts/limits.py), in the comparison and again
when the gate re-measures it at once with twice the rounds (a load spike rarely lasts). The
judging is judging.py's.
Deterministic metrics (the metric catalogue says which) regress on any increase beyond their
tolerance: asv's track_<metric> results, and the baselines (benchmarks/baselines/) checked on the
head commit and, where head differs from them, on the base commit too: a difference already there
is named as such, not blamed on head.
Exit codes: 0 no regression, 1 a regression (each named with both numbers, the ratio and its
limit), 2 the gate could not decide (bad configuration, unknown revision, build or benchmark
failure, a crashing baseline check).
asv's own exit code mixes the last two, so the verdict is read from its stored results.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import re
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import limits as time_limits  # sibling scripts
from judging import Verdict, check_baselines, ratio_of, time_verdict
from plumbing import (
    ROOT,
    Gate,
    GateError,
    commit_of,
    elapsed,
    ensure_machine,
    kept,
    last_code_change,
    resolve_base,
    same_tree_commit,
    say,
    short,
    snapshot_worktree,
)

DEFAULT_ROUNDS = 6  # where the limits record no rounds of their own (--factor, none calibrated)
MIN_ROUNDS = 2  # rounds are what the gate interleaves
DEVICES = ("cpu", "cuda")


def core_time_regex(backends: Sequence[str] = (), device: str = "cpu") -> str:
    """asv's names of the attention cores' forward and forward+backward times at 1,024 tokens on
    one thread of `device`, for `backends` (default: every one)."""
    names = "|".join(re.escape(b) for b in backends) or "[^']+"
    params = rf"\('{device}', 1, 'attention', '({names})', 1024, 'forward(\+backward)?'\)"
    return rf"^bench_attention\.Time\.time_step{params}$"


def block_time_regex(device: str = "cpu") -> str:
    """asv's name of one block variant's time: a reversible 2-layer model's training step."""
    return rf"^bench_blocks\.ResidualLayers\.time_train_step\('{device}', 1, 'reversible', 2\)$"


def fast_bench(device: str = "cpu") -> list[str]:
    """CI's subset on `device`: every attention core, and one block variant."""
    return [core_time_regex(device=device), block_time_regex(device)]


OK, REGRESSION, ERROR = 0, 1, 2


def calibrate(gate: Gate, head: str) -> int:
    """Run the comparison `--calibrate` times on head against a copy of itself; print each time
    benchmark's largest ratio (either way) and store the limits drawn from them."""
    args = gate.args
    worst: dict[str, float] = {}
    with kept(same_tree_commit(head), "calibration") as twin:
        for i in range(args.calibrate):
            say(f"calibration run {i + 1}/{args.calibrate}")
            # alternate which copy is "base": commit order cannot bias the result
            base, new = (twin, head) if i % 2 else (head, twin)
            result = gate.compare(base, new, args.bench, args.rounds)
            run_worst = (0.0, "")
            for m in result.rows:
                if m.kind != "time" or not (r := ratio_of(m)) or not math.isfinite(r):
                    continue
                ratio = max(r, 1 / r)
                worst[m.benchmark] = max(worst.get(m.benchmark, 0.0), ratio)
                run_worst = max(run_worst, (ratio, m.benchmark))
            say(f"calibration run {i + 1}: largest ratio {run_worst[0]:.3f}x ({run_worst[1]})")
    if not worst:
        raise GateError("no time benchmark produced a result in the calibration runs")
    written = time_limits.write(
        worst, args.calibrate, args.machine, head, args.limits, rounds=args.rounds
    )
    print(f"\nlargest ratio between identical commits in {args.calibrate} runs (either way):")
    for name, ratio in sorted(worst.items(), key=lambda kv: -kv[1]):
        limit = written.for_benchmark(name)
        print(f"  {ratio:6.3f}x  limit {limit.factor:.2f}x  {name}")
    print(f"wrote {args.limits}: review the diff and commit it with the baselines")
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
        "--before-code-change",
        action="store_true",
        help="base: the parent of the latest commit, head included, that changed code (anything "
        "but docs/, reports/, tests/, Markdown and mkdocs.yml): on a commit that changes only "
        "those, the code before it is compared, not a copy of itself (CI's choice)",
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
        help="asv benchmark regex, matched against name(params); repeatable (default: all of "
        "--device's)",
    )
    parser.add_argument(
        "--fast", action="store_true", help="CI's subset (fast_bench): cores and one block"
    )
    parser.add_argument(
        "--device",
        choices=DEVICES,
        default="cpu",
        help="the device of --fast's subset and of the default selection (default: %(default)s)",
    )
    parser.add_argument(
        "--factor",
        type=float,
        help="one time limit for every benchmark instead of the calibrated ones",
    )
    parser.add_argument(
        "--limits",
        type=Path,
        default=time_limits.PATH,
        help="calibrated time limits (default: %(default)s); --calibrate writes it",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        help="asv rounds per commit, interleaved across the two (default: the rounds this "
        f"processor's limits were calibrated with, else {DEFAULT_ROUNDS})",
    )
    parser.add_argument("--no-baselines", action="store_true", help="skip the baseline check")
    parser.add_argument(
        "--quick-baselines",
        action="store_true",
        help="check only the quick pass's baseline cases (one per backend: what --fast checks)",
    )
    parser.add_argument(
        "--no-confirm",
        action="store_true",
        help="do not re-measure time benchmarks over their limit (one run decides)",
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
        help="run the comparison N times on head against a copy of itself; print the noise and "
        "write the limits drawn from it to --limits",
    )
    parser.add_argument(
        "--machine", default=platform.node() or "local", help="asv machine name (default: host)"
    )
    parser.add_argument(
        "--config", type=Path, default=ROOT / "asv.conf.json", help="asv configuration"
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
    parser.add_argument(
        "--json", type=Path, help="also write what the gate found to this file, as JSON"
    )
    args = parser.parse_args(argv)
    if args.before_code_change and args.base:
        parser.error("--before-code-change chooses the base: give it or --base, not both")
    if args.report_summary and not args.comment:
        parser.error("--report-summary goes into --comment: give both")
    if args.fast:
        args.bench = [*args.bench, *fast_bench(args.device)]
    elif not args.bench and args.device != "cpu":
        args.bench = [rf"\('{args.device}'"]  # every benchmark with that device parameter
    if args.rounds is not None and args.rounds < MIN_ROUNDS:
        parser.error(f"--rounds must be >= {MIN_ROUNDS} (rounds are what is interleaved)")
    if args.factor is not None and args.factor <= 1:
        parser.error("--factor must be > 1")
    if args.calibrate is not None and (args.calibrate < 1 or args.no_time):
        parser.error("--calibrate needs N >= 1 and the time comparison (no --no-time)")
    try:
        args.limits_used = (
            time_limits.Limits.uniform(args.factor)
            if args.factor
            else time_limits.Limits.load(args.limits)
        )
    except (ValueError, KeyError, TypeError, AttributeError) as err:  # damaged: exit 2, one line
        parser.exit(
            2,
            f"gate: error: --limits {args.limits} is not a time-limits file (JSON with a "
            f"'processors' table, as gate.py --calibrate writes): {type(err).__name__}\n",
        )
    if args.rounds is None:  # a limit holds for the sampling its noise was measured with
        args.rounds = args.limits_used.rounds or DEFAULT_ROUNDS
    return args


def run(args: argparse.Namespace, verdict: Verdict) -> int:
    gate = None if args.no_time else Gate(args)
    head_name = args.head
    head = snapshot_worktree() if head_name == "worktree" else commit_of(head_name)
    if head is None:
        raise GateError(f"unknown revision {head_name!r}")
    with kept(head, "head"):
        if args.calibrate:
            ensure_machine(args.machine)
            return calibrate(gate, head)
        base = resolve_base(base_of(args, head), head, args.missing_base_ok)
        if base is None:
            write_comment(args, "skipped: no base commit in this clone to compare against", [], [])
            return OK
        if base == head:
            raise GateError(f"base and head are the same commit ({head[:8]}): nothing to compare")
        say(f"base {short(base)}")
        say(f"head {short(head)}")
        if gate is not None:
            say(f"{args.rounds} rounds a side")
            found = time_verdict(gate, base, head, args.limits_used)
            for key in ("regressions", "notes", "failures", "rows", "remeasured"):
                setattr(verdict, key, getattr(found, key))
        if not args.no_baselines:
            say("checking the deterministic baselines on the head commit")
            more, other = check_baselines(head, base, quick=args.fast or args.quick_baselines)
            say("baseline check done")
            verdict.regressions += more
            verdict.notes += other
    print()
    for line in verdict.notes:
        print(f"gate: note: {line}")
    if verdict.failures:
        raise GateError("benchmark(s) failed:\n  " + "\n  ".join(verdict.failures))
    if verdict.regressions:
        print(f"gate: REGRESSION ({len(verdict.regressions)}):")
        for line in verdict.regressions:
            print(f"  {line}")
        write_comment(
            args, f"REGRESSION ({len(verdict.regressions)})", verdict.regressions, verdict.notes
        )
        return REGRESSION
    message = "no regression (times within their limits; memory and FLOPs exact)"
    print(f"gate: {message}")
    write_comment(args, message, [], verdict.notes)
    return OK


def base_of(args: argparse.Namespace, head: str) -> str | None:
    """--base, or with --before-code-change the parent of the latest code change (said)."""
    if not args.before_code_change:
        return args.base
    changed = last_code_change(head)
    if changed is None:
        say("no code change found in this clone's history: head's parent is the base")
        return f"{head}~1"
    if changed != head:
        say(f"head changes no code; the latest code change: {short(changed)}")
    return f"{changed}~1"


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
    verdict, code, error = Verdict(), ERROR, None
    try:
        code = run(args, verdict)
    except GateError as exc:
        error = str(exc)
        print(f"gate: error: {exc}", file=sys.stderr)
        reason = [line.strip() for line in error.strip().splitlines()]  # e.g. failed benchmarks
    except Exception:  # a bug or an unexpected asv/git state is still "could not decide"
        error = traceback.format_exc()
        print(error, file=sys.stderr)
        print("gate: error: unexpected failure (traceback above)", file=sys.stderr)
        reason = [error.strip().splitlines()[-1]]
    if error is not None:  # the comment is written whatever the outcome
        write_comment(args, "could not decide", reason, verdict.notes)
    if args.json:
        found = verdict.as_json(args.limits_used)
        found.update(exit=code, error=error, seconds=round(elapsed(), 1))
        args.json.write_text(json.dumps(found, indent=1) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
