"""Judge the decoding targets on a stored `zoo bench --modes decode` run (CPU, core level, every
ratio within the one run):

    python benchmarks/scripts/decoding_targets.py --store results/decode.sqlite [--run-id ID]

  linear, performer, local, sliding-window and the recurrences (retention, gla, deltanet,
  gated-deltanet): time per token at the longest context <= 1.2x at the shortest, and equal state
  bytes
  sdpa: time per token fitted exponent <= 1.1 over the lengths from 4096 up
  sdpa with kv_heads=1 beside sdpa, at the longest context: state bytes 1/4 (4 heads), time per
  token not above it
  sdpa recomputing the prefix / sdpa's KV cache, per token at 16384: >= 20x

A target whose times were set aside (taken while the machine was busy, or unstable: the report's
rule, measure/trust.py), or whose cases are missing, is UNDECIDED, never passed. Exit status 1
when a decided target fails.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from attention_zoo.errors import UsageError, ZooError
from attention_zoo.report.analysis import fit_exponent
from attention_zoo.report.context import trusted
from attention_zoo.report.frame import bench_frame, case_frame
from attention_zoo.store import open_store

sys.path.insert(0, str(Path(__file__).resolve().parent))
from verdicts import report

PATTERNS = ("linear", "performer", "local", "sliding-window")
RECURRENCES = ("retention", "gla", "deltanet", "gated-deltanet")
FLAT = dict.fromkeys(PATTERNS + RECURRENCES, 1.2)
SHARED_KV = {"kv_heads": 1}  # one KV head: a quarter of the cache of 4 heads
KV_BACKEND, KV_FROM, KV_EXPONENT = "sdpa", 4096, 1.1
RECOMPUTE_AT, RECOMPUTE_FACTOR = 16384, 20.0
TIME, STATE = "time_median", "state_bytes"


def decode_rows(store_path: str, run_id: str | None) -> Any:
    """The decode cases of the run (default: the store's latest), one row per case."""
    with open_store(store_path, write=False) as store:
        runs = store.runs()
        if not runs:
            raise UsageError(f"{store_path} holds no run to judge")
        run_id = run_id or runs[-1]["run_id"]
        if run_id not in {r["run_id"] for r in runs}:
            raise UsageError(f"{store_path} holds no run {run_id!r}")
        cases = case_frame(store.rows(run_id), runs)
    bench = bench_frame(cases)
    if bench.empty or "mode" not in bench:
        raise UsageError(
            f"run {run_id} holds no bench case (a decode run: zoo bench --modes decode)"
        )
    return bench[bench["mode"] == "decode"], run_id


def _series(
    rows: Any, backend: str, decoder: str = "own", options: dict | None = None
) -> dict[int, Any]:
    """The backend's rows by length, with these options (default: none; kv_heads equal to the
    heads is none) and decoder."""
    own = [
        r
        for _, r in rows.iterrows()
        if r["backend"] == backend
        and r["config"].get("decoder", "own") == decoder
        and _options(r) == (options or {})
    ]
    return {int(r["seq_len"]): r for r in own}


def _options(row: Any) -> dict:
    options = dict(row["config"].get("options") or {})
    if options.get("kv_heads") == row["config"].get("num_heads"):
        del options["kv_heads"]  # a KV head a query head: the default
    return options


def _undecided(rows: list[Any]) -> str | None:
    bad = [f"L={r['seq_len']}" for r in rows if not trusted(r, TIME)]
    return f"UNDECIDED: times set aside or missing at {', '.join(bad)}" if bad else None


def judge(rows: Any) -> list[tuple[str, str]]:
    """(target, verdict text) per target."""
    out = []
    for backend, limit in FLAT.items():
        series = _series(rows, backend)
        name = f"{backend}: time per token at the longest context <= {limit}x the shortest"
        if len(series) < 2:
            out.append((name, "UNDECIDED: fewer than two lengths measured"))
            continue
        short, long = series[min(series)], series[max(series)]
        if reason := _undecided([short, long]):
            out.append((name, reason))
            continue
        ratio = long["metrics"][TIME] / short["metrics"][TIME]
        same_state = long["metrics"].get(STATE) == short["metrics"].get(STATE)
        ok = ratio <= limit and same_state
        out.append(
            (
                name,
                f"{'PASS' if ok else 'FAIL'}: {ratio:.3f}x from L={min(series)} to "
                f"L={max(series)}; state bytes {'equal' if same_state else 'differ'} "
                f"({short['metrics'].get(STATE)} vs {long['metrics'].get(STATE)})",
            )
        )
    series = {n: r for n, r in _series(rows, KV_BACKEND).items() if n >= KV_FROM}
    name = f"{KV_BACKEND}: time per token exponent <= {KV_EXPONENT} from L={KV_FROM}"
    if len(series) < 2:
        out.append((name, "UNDECIDED: fewer than two lengths measured"))
    elif reason := _undecided(list(series.values())):
        out.append((name, reason))
    else:
        lengths = sorted(series)
        fit = fit_exponent(lengths, [series[n]["metrics"][TIME] for n in lengths])
        verdict = "PASS" if fit.exponent <= KV_EXPONENT else "FAIL"
        out.append((name, f"{verdict}: exponent {fit.exponent:.3f} over L={lengths}"))
    own = _series(rows, KV_BACKEND).get(RECOMPUTE_AT)
    again = _series(rows, KV_BACKEND, "recompute").get(RECOMPUTE_AT)
    name = f"{KV_BACKEND} at L={RECOMPUTE_AT}: recomputing / KV cache >= {RECOMPUTE_FACTOR}x"
    if own is None or again is None:
        out.append((name, "UNDECIDED: both decoders not measured at that length"))
    elif reason := _undecided([own, again]):
        out.append((name, reason))
    else:
        ratio = again["metrics"][TIME] / own["metrics"][TIME]
        verdict = "PASS" if ratio >= RECOMPUTE_FACTOR else "FAIL"
        out.append((name, f"{verdict}: {ratio:.1f}x per token"))
    out.append(_shared_kv(rows))
    return out


def _shared_kv(rows: Any) -> tuple[str, str]:
    """sdpa with one KV head beside four, at the longest context both measured."""
    shared, plain = _series(rows, KV_BACKEND, options=SHARED_KV), _series(rows, KV_BACKEND)
    name = f"{KV_BACKEND} kv_heads=1 vs 4 heads: state 1/4, time per token not above"
    both = sorted(set(shared) & set(plain))
    if not both:
        return name, "UNDECIDED: both not measured at one length"
    n = both[-1]
    if reason := _undecided([shared[n], plain[n]]):
        return name, reason
    state = shared[n]["metrics"].get(STATE) / plain[n]["metrics"].get(STATE)
    time = shared[n]["metrics"][TIME] / plain[n]["metrics"][TIME]
    ok = abs(state - 0.25) <= 0.01 and time <= 1.0  # a cache's few bookkeeping bytes aside
    return name, f"{'PASS' if ok else 'FAIL'}: at L={n} state {state:.3f}x, time {time:.3f}x"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="the results store of the decode run")
    parser.add_argument("--run-id", help="the run to judge (default: the store's latest)")
    args = parser.parse_args(argv)
    try:
        rows, run_id = decode_rows(args.store, args.run_id)
    except ZooError as exc:  # no store there, not a store: one line
        print(f"decoding_targets.py: {exc}", file=sys.stderr)
        return 2
    print(f"run {run_id}: {len(rows)} decode cases")
    verdicts = judge(rows)
    return report(verdicts)


if __name__ == "__main__":
    sys.exit(main())
