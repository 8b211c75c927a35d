"""Judge the GPU targets on the GPU check's store (bfloat16, core level, forward+backward, every
ratio to sdpa within one run and between cases captured the same way):

    python benchmarks/scripts/gpu_targets.py --store results/gpu-check.sqlite

  time at 16k / 64k tokens: local, sliding-window <= 0.45x / 0.08x; bigbird <= 1.0x / 0.2x;
  lsh 1 and 4 hashes <= 2.0x / 0.2x and 3.0x / 0.5x; linear, performer <= 3.0x / 0.3x and
  3.5x / 0.6x; bidirectional nystrom, linformer <= 1.0x / 0.15x and 1.0x / 0.3x
  peak memory at 16k <= 1.5x sdpa's (lsh with 4 hashes and performer <= 3x)
  decode, captured, at a 64k context: sdpa, linear, performer <= 0.05 ms a token

A ratio between a captured case and one that was not (it would compare host time with kernel
time), a time set aside (busy, unstable) and a missing case are UNDECIDED, never passed. Exit
status 1 when a decided target fails.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from attention_zoo.errors import ZooError
from attention_zoo.report.context import trusted
from attention_zoo.report.frame import bench_frame, case_frame
from attention_zoo.store import facts_of, open_store

sys.path.insert(0, str(Path(__file__).resolve().parent))
from verdicts import report

SHORT, LONG = 16384, 65536
TIME, PEAK = "time_median", "peak_bytes"
REFERENCE = "sdpa"
DECODE_AT, DECODE_LIMIT_S = LONG, 0.05e-3
DECODERS = ("sdpa", "linear", "performer")


@dataclass(frozen=True)
class Target:
    """A core's time limits (ratio to sdpa) by length, and its peak memory limit at SHORT."""

    backend: str
    time: dict[int, float]
    options: dict[str, Any] = field(default_factory=dict)  # a subset of the case's options
    causal: bool = True
    memory: float = 1.5

    def name(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in self.options.items())
        kind = "" if self.causal else " (bidirectional)"
        return f"{self.backend}{f'({opts})' if opts else ''}{kind}"


TARGETS = (
    Target("local", {SHORT: 0.45, LONG: 0.08}),
    Target("sliding-window", {SHORT: 0.45, LONG: 0.08}),
    Target("bigbird", {SHORT: 1.0, LONG: 0.2}),
    Target("lsh", {SHORT: 2.0, LONG: 0.2}, {"num_hashes": 1}),
    Target("lsh", {SHORT: 3.0, LONG: 0.5}, {"num_hashes": 4}, memory=3.0),
    Target("linear", {SHORT: 3.0, LONG: 0.3}),
    Target("performer", {SHORT: 3.5, LONG: 0.6}, memory=3.0),
    Target("nystrom", {SHORT: 1.0, LONG: 0.15}, causal=False),
    Target("linformer", {SHORT: 1.0, LONG: 0.3}, causal=False),
)


def load_rows(store_path: str) -> Any:
    """Every bench case of the store's runs, one row per case, with its run id."""
    with open_store(store_path, write=False) as store:
        runs = store.runs()
        frames = [case_frame(store.rows(r["run_id"]), runs) for r in runs]
    frames = [f for f in frames if not f.empty]
    return bench_frame(pd.concat(frames, ignore_index=True)) if frames else None


def captured(row: Any) -> bool:
    """Whether the case's timed step was a CUDA graph's replay (its facts' cuda_graphs)."""
    graphs = facts_of(row.get("facts")).get("cuda_graphs") or {}
    return bool(isinstance(graphs, dict) and graphs.get("on"))


def _find(rows: Any, backend: str, mode: str, n: int, causal: bool, options: dict) -> list[Any]:
    found = []
    for _, r in rows.iterrows():
        opts = r["config"].get("options") or {}
        if (
            r["backend"] == backend
            and r["mode"] == mode
            and r["seq_len"] == n
            and r["causal"] == causal
            and r["target"] == "attention"
            and r["dtype"] == "bfloat16"
            and str(r["device"]).startswith("cuda")
            and all(opts.get(k) == v for k, v in options.items())
        ):
            found.append(r)
    return found


def _pair(rows: Any, target: Target, n: int) -> tuple[Any, Any] | str:
    """(the target's case, sdpa's) of one run at length n, or why there is none."""
    own = _find(rows, target.backend, "forward+backward", n, target.causal, target.options)
    ref = {r["run_id"]: r for r in _find(rows, REFERENCE, "forward+backward", n, target.causal, {})}
    both = [(r, ref[r["run_id"]]) for r in own if r["run_id"] in ref]
    if not own:
        return "UNDECIDED: not measured"
    if not both:
        return "UNDECIDED: not measured beside sdpa in one run"
    return both[-1]


def _ratio(rows: Any, target: Target, n: int, metric: str) -> tuple[float, Any, Any] | str:
    """The target's `metric` over sdpa's at length n in one run, with both rows; or why not."""
    pair = _pair(rows, target, n)
    if isinstance(pair, str):
        return pair
    own, ref = pair
    if not (trusted(own, metric) and trusted(ref, metric)):
        return "UNDECIDED: a number set aside (busy, unstable) or missing"
    return own["metrics"][metric] / ref["metrics"][metric], own, ref


def judge_time(rows: Any, target: Target, n: int) -> str:
    found = _ratio(rows, target, n, TIME)
    if isinstance(found, str):
        return found
    ratio, own, ref = found
    if captured(own) != captured(ref):
        return "UNDECIDED: one of the two was captured and the other not"
    how = "both captured" if captured(own) else "neither captured"
    return f"{'PASS' if ratio <= target.time[n] else 'FAIL'}: {ratio:.3f}x ({how})"


def judge_memory(rows: Any, target: Target) -> str:
    found = _ratio(rows, target, SHORT, PEAK)
    if isinstance(found, str):
        return found
    return f"{'PASS' if found[0] <= target.memory else 'FAIL'}: {found[0]:.2f}x"


def judge_decode(rows: Any, backend: str) -> str:
    found = _find(rows, backend, "decode", DECODE_AT, True, {})
    if not found:
        return "UNDECIDED: not measured"
    row = found[-1]
    if not trusted(row, TIME):
        return "UNDECIDED: its time set aside (busy, unstable) or missing"
    if not captured(row):
        return "UNDECIDED: not captured"
    ms = row["metrics"][TIME] * 1e3
    return f"{'PASS' if row['metrics'][TIME] <= DECODE_LIMIT_S else 'FAIL'}: {ms:.3f} ms"


def judge(rows: Any) -> list[tuple[str, str]]:
    """(target, verdict) for every target."""
    out = []
    for target in TARGETS:
        name = target.name()
        for n, limit in target.time.items():
            out.append((f"{name} at {n}: time <= {limit}x sdpa", judge_time(rows, target, n)))
        peak = f"{name} at {SHORT}: peak <= {target.memory}x sdpa"
        out.append((peak, judge_memory(rows, target)))
    for backend in DECODERS:
        name = f"{backend} decode at a {DECODE_AT} context: <= {DECODE_LIMIT_S * 1e3:g} ms a token"
        out.append((name, judge_decode(rows, backend)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="the GPU check's results store")
    args = parser.parse_args(argv)
    try:
        rows = load_rows(args.store)
    except ZooError as exc:  # no store there, not a store: one line
        print(f"gpu_targets.py: {exc}", file=sys.stderr)
        return 2
    if rows is None or rows.empty:
        print(f"gpu_targets.py: {args.store} holds no bench case", file=sys.stderr)
        return 2
    verdicts = judge(rows)
    return report(verdicts)


if __name__ == "__main__":
    sys.exit(main())
