"""How far apart this machine reads identical code with the gate's sampling, and how many rounds
would hold it to a target: a series of rounds, each a fresh process timing the same cases the suite
times (one thread, glibc's heap on huge pages, one window of samples each), then every stretch of
2R consecutive rounds (one starting at every other round) read as a gate run of R rounds a side, in
the gate's order and with its statistic (each side's samples pooled, their low quantile).

    python benchmarks/scripts/noise.py --series 64 --log noise.jsonl   # ~7 s a round, 6 cases
    python benchmarks/scripts/noise.py --read noise.jsonl --target 1.05

A machine whose stretches already read beyond the target cannot be held to it by the gate at that
many rounds: the noise is the machine's. `gate.py --calibrate` measures the gate itself.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gate  # sibling scripts
import plumbing
import sides as gate_sides

# Six of the gate's cases: four of the noisiest in benchmarks/baselines/time-limits.json (on one
# processor or another) and two of the quietest.
DEFAULT_CASES = (
    "deltanet:forward+backward",
    "local:forward+backward",
    "full:forward",
    "lsh:forward+backward",
    "local:forward",
    "performer:forward",
)
SEQ_LEN = 1024  # the gate's length (its --fast subset)
# asv's repeat as the gate sets it: (at least, at most, seconds) samples a case, after a warm-up.
MIN_SAMPLES, MAX_SAMPLES, WINDOW_S = (
    float(x) for x in plumbing.SAMPLING["repeat"].strip("()").split(",")
)
WARMUP_S = float(plumbing.SAMPLING["warmup_time"])

# One round, as asv's forkserver runs one: the suite imported once, then a fork per case that
# runs the suite's own Time benchmark, its setup hooks before every sample, for a warm-up and then
# a window; each fork prints {case: its window's samples in seconds}.
ROUND = """
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from benchmarks import bench_attention, common
warmup, window, least, most, seq_len = map(float, sys.argv[2:7])
for spec in sys.argv[7:]:
    sys.stdout.flush()
    if os.fork():
        _, status = os.wait()
        if status:
            sys.exit(f"{spec}: its process ended with status {status}")
        continue
    backend, mode = spec.split(":")
    params = ("cpu", 1, "attention", backend, int(seq_len), mode)
    bench = bench_attention.Time()
    for limit, fewest in ((warmup, 1), (window, least)):
        samples, start = [], time.perf_counter()
        while len(samples) < most and (
            time.perf_counter() - start < limit or len(samples) < fewest
        ):
            common.setup()
            bench.setup(*params)
            began = bench.timer()
            bench.time_step(*params)
            samples.append(bench.timer() - began)
    print(json.dumps({spec: samples}), flush=True)
    os._exit(0)
"""


Round = dict[str, list[float]]  # one round: each case's samples, in seconds


class NoiseError(Exception):
    """Bad input or a failed round, said in one line."""


def measure_round(cases: Sequence[str], window: float, warmup: float) -> Round:
    """One round in a fresh interpreter, with the gate's environment (huge pages)."""
    sampling = [warmup, window, MIN_SAMPLES, MAX_SAMPLES, SEQ_LEN]
    done = subprocess.run(
        [sys.executable, "-c", ROUND, str(plumbing.ROOT), *map(str, sampling), *cases],
        capture_output=True,
        text=True,
        env={**os.environ, **gate_sides.huge_pages_env()},
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or len(lines) != len(cases):
        said = done.stderr.strip().splitlines() or [f"exit {done.returncode}, no message"]
        raise NoiseError(f"a round failed: {said[-1]}")
    row: Round = {}
    for line in lines:
        row.update(json.loads(line))
    return row


def stretch_ratios(series: Sequence[Round], rounds: int) -> list[dict[str, float]]:
    """Per stretch of 2 * `rounds` consecutive rounds (one starting at every other round), per
    case: the two sides' times (plumbing.low_quantile of each side's samples) apart, as the larger
    over the smaller (identical code: either way is noise)."""
    order = gate_sides.interleaved(["a", "b"], rounds)
    out = []
    for start in range(0, len(series) - 2 * rounds + 1, 2):
        stretch = series[start : start + 2 * rounds]
        ratios = {}
        for case in stretch[0]:
            side = {"a": [], "b": []}
            for r, s in zip(stretch, order):
                side[s] += r[case]
            a, b = plumbing.low_quantile(side["a"]), plumbing.low_quantile(side["b"])
            ratios[case] = max(a, b) / min(a, b)
        out.append(ratios)
    return out


def summary(series: Sequence[Round], target: float, rounds: Sequence[int]) -> str:
    """Each case's spread over the rounds, then per rounds-a-side the stretches' largest ratio
    and how many kept every case within `target`."""
    cases = list(series[0])
    lines = [f"{len(series)} rounds; per case, each round's time against the lowest:"]
    lines.append(f"  {'case':26s} {'lowest':>9s} {'median':>7s} {'max':>7s}")
    for case in cases:
        values = [plumbing.low_quantile(r[case]) for r in series]
        low = min(values)
        lines.append(
            f"  {case:26s} {low * 1e3:7.2f}ms {statistics.median(values) / low:6.3f}x "
            f"{max(values) / low:6.3f}x"
        )
    lines.append(f"read as gate runs (identical code on both sides; target {target:.2f}x):")
    for r in rounds:
        stretches = stretch_ratios(series, r)
        if not stretches:
            lines.append(f"  {r} rounds a side: fewer than {2 * r} rounds in the series")
            continue
        worst = [max(s.values()) for s in stretches]
        held = sum(w <= target for w in worst)
        by_case = {c: max(s[c] for s in stretches) for c in cases}
        noisiest = max(by_case, key=by_case.get)
        lines.append(
            f"  {r} rounds a side, {len(stretches)} gate runs: largest ratio median "
            f"{statistics.median(worst):.3f}x, max {max(worst):.3f}x ({noisiest}); every case "
            f"within {target:.2f}x in {held} of {len(stretches)} ({held / len(stretches):.0%}), "
            f"so 5 runs in a row about {(held / len(stretches)) ** 5:.0%} if runs were independent"
        )
    return "\n".join(lines)


def _is_time(t: object) -> bool:
    """A sample as a round logs it: a positive, finite number of seconds."""
    return isinstance(t, (int, float)) and not isinstance(t, bool) and 0 < t < math.inf


def read_series(path: Path) -> list[Round]:
    """The rounds a --log file holds; every round must time the same cases."""
    if not path.is_file():
        raise NoiseError(f"no series at {path}: write one with --series N --log {path}")
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = {k: v for k, v in json.loads(line).items() if k != "at"}
        except (ValueError, AttributeError):
            raise NoiseError(f"{path}:{number} is not a round noise.py wrote") from None
        if any(isinstance(v, (int, float)) for v in row.values()):
            raise NoiseError(
                f"{path}:{number} holds one number a case (an older noise.py's log): its samples "
                "are not there; measure the series again"
            )
        if not all(isinstance(v, list) and v and all(_is_time(t) for t in v) for v in row.values()):
            raise NoiseError(f"{path}:{number} is not a round noise.py wrote")
        if not row or (rows and row.keys() != rows[0].keys()):
            raise NoiseError(f"{path}:{number} times other cases than line 1: one series per file")
        rows.append(row)
    if len(rows) < 2:
        raise NoiseError(f"{path} holds {len(rows)} round(s); a comparison needs 2 or more")
    return rows


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--series", type=int, metavar="N", help="measure N rounds, one at a time")
    what.add_argument(
        "--read", type=Path, metavar="FILE", help="summarise a series measured before"
    )
    parser.add_argument("--log", type=Path, help="with --series: append each round here (JSONL)")
    parser.add_argument(
        "--cases",
        default=",".join(DEFAULT_CASES),
        help="backend:mode,... timed at 1,024 tokens (default: six of the gate's cases)",
    )
    parser.add_argument("--window", type=float, default=WINDOW_S, help="seconds sampled a case")
    parser.add_argument(
        "--target", type=float, default=1.05, help="ratio to hold identical code to"
    )
    parser.add_argument(
        "--rounds",
        default="2,4,6,8",
        help="rounds a side to read it as (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    try:
        args.rounds = [int(r) for r in args.rounds.split(",")]
    except ValueError:
        parser.error(f"--rounds takes integers, comma-separated, e.g. 4,8 (got {args.rounds!r})")
    if min(args.rounds) < gate.MIN_ROUNDS:
        parser.error(f"--rounds: each must be >= {gate.MIN_ROUNDS}")
    if args.series is not None and args.series < 2:
        parser.error("--series must be >= 2 (a comparison needs two rounds)")
    if not args.window > 0 or not math.isfinite(args.window):
        parser.error("--window must be a positive number of seconds")
    args.cases = [c for c in args.cases.split(",") if c]
    if args.read is not None:
        return args
    if not args.cases:
        parser.error("--cases names no case (e.g. lsh:forward,local:forward)")
    sys.path.insert(0, str(plumbing.ROOT))
    from benchmarks.common import MODES as modes
    from benchmarks.common import backend_names

    known = set(backend_names())
    for case in args.cases:
        backend, _, mode = case.partition(":")
        if backend not in known or mode not in modes:
            parser.error(
                f"--cases: {case!r} is not backend:mode (backends: {', '.join(sorted(known))}; "
                f"modes: {', '.join(modes)})"
            )
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.read is not None:
            series = read_series(args.read)
        else:
            series = []
            for i in range(args.series):
                row = measure_round(args.cases, args.window, WARMUP_S)
                series.append(row)
                if args.log:
                    with args.log.open("a") as log:
                        log.write(json.dumps({"at": time.time(), **row}) + "\n")
                print(f"noise: round {i + 1}/{args.series}", flush=True)
    except NoiseError as exc:
        print(f"noise.py: {exc}", file=sys.stderr)
        return 2
    print(summary(series, args.target, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
