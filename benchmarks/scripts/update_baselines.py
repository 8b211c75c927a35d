"""Check or regenerate benchmarks/baselines/deterministic.json (FLOPs, predicted, tracked bytes).

    python benchmarks/scripts/update_baselines.py --check   # compare only; exit 1 on a difference
    python benchmarks/scripts/update_baselines.py           # regenerate (after a time check)

Regenerating records a memory or FLOP change as intended, so it first compares the time of what
changed: the gate (benchmarks/scripts/gate.py) times the changed backends' cores (and the model,
when a model case changed) on the merge base against the working tree, and the file is written only
when that shows no time regression. A decrease deserves the same look as an increase: less memory
can mean work that is no longer done. Review the diff of the file and commit it with the change.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from attention_zoo.measure import baseline

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gate  # the sibling script: the time comparison


def record(name: str, case: baseline.BenchCase, diff: baseline.Difference) -> dict:
    """One difference as the JSON record `--check --json` prints (the gate reads it)."""
    return {
        "case": name,
        "key": case.key(),
        "tolerance": baseline.TOLERANCE[diff.metric],
        "backends": case.backends(),
        "model": case.target == "model",
        "metric": diff.metric,
        "baseline": diff.baseline,
        "actual": diff.actual,
        "ratio": diff.ratio,
        "increase": diff.increase,
        "message": f"{name}: {diff.message()}",
    }


def check(path: str, as_json: bool, quick: bool, keys: list[str]) -> int:
    """Recompute the stored cases (`quick`: the quick pass's; `keys`: only these); exit 1 when
    any differs."""
    stored = baseline.load(path)["cases"]
    wanted = {c.key() for c in baseline.quick_cases()} if quick else set(stored)
    if keys:
        if unknown := sorted(set(keys) - set(stored)):
            print(
                f"update_baselines: error: no stored case {unknown[0]!r} in {path}", file=sys.stderr
            )
            return 2
        wanted &= set(keys)
    records = []
    for key, entry in stored.items():
        case = baseline.BenchCase.from_dict(entry["case"])
        if key not in wanted:
            continue
        if reason := baseline.case_available(case):
            print(f"skip {entry['name']}: {reason}", file=sys.stderr)
            continue
        records += [
            record(entry["name"], case, d) for d in baseline.compare(entry, baseline.compute(case))
        ]
    if as_json:
        print(json.dumps(records, indent=1))
    else:
        for r in records:
            print(f"FAIL {r['message']}")
        print(f"{len({r['case'] for r in records})} case(s) differ from {path}")
    return 1 if records else 0


def time_check(records: list[dict], base: str | None) -> int:
    """The gate's time comparison of what changed, merge base vs working tree: its exit code."""
    backends = sorted({b for r in records if not r["model"] for b in r["backends"]})
    bench = [gate.core_time_regex(backends)] if backends else []
    if any(r["model"] for r in records):
        bench.append(gate.block_time_regex())
    argv = ["--head", "worktree", "--no-baselines", *(["--base", base] if base else [])]
    for regex in bench:
        argv += ["--bench", regex]
    print(f"comparing time first: python benchmarks/scripts/gate.py {' '.join(argv)}", flush=True)
    return gate.main(argv)


def regenerate(path: str, base: str | None, skip_time_check: str | None) -> int:
    """Compute every available case; when a stored one changed, compare time before writing."""
    old = baseline.load(path)["cases"] if Path(path).exists() else {}
    entries, records = {}, []
    for case in baseline.baseline_cases():
        if reason := baseline.case_available(case):
            print(f"skip {case.name()}: {reason}")
            continue
        key = case.key()
        entries[key] = baseline.entry(case)
        if key in old:
            records += [
                record(case.name(), case, d) for d in baseline.compare(old[key], entries[key])
            ]
        else:
            print(f"new: {case.name()}")
    for r in records:
        print(f"changed: {r['message']}")
    if records and skip_time_check:
        print(f"time comparison skipped: {skip_time_check}")
    elif records:
        code = time_check(records, base)
        if code != gate.OK:
            why = "a time regression" if code == gate.REGRESSION else "no time comparison"
            print(
                f"not regenerated: {why} (above). Fix it, or pass --skip-time-check 'why' when "
                "the time comparison cannot run here",
                file=sys.stderr,
            )
            return code
    baseline.write(entries, path)
    for e in entries.values():
        print(
            f"{e['name']:70s} {e['flops'] / 1e9:9.3f} GFLOP  "
            f"predicted {e['predicted_peak_bytes'] / 2**20:9.2f} MiB"
            f"  tracked {e['tracked_peak_bytes'] / 2**20:9.2f} MiB"
        )
    print(f"wrote {path} ({len(entries)} cases): review the diff and commit it")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--path", default=str(baseline.DEFAULT_PATH), help="baseline file (default: %(default)s)"
    )
    parser.add_argument("--check", action="store_true", help="compare only, do not write")
    parser.add_argument("--json", action="store_true", help="with --check: differences as JSON")
    parser.add_argument(
        "--quick", action="store_true", help="with --check: only the quick test pass's cases"
    )
    parser.add_argument(
        "--case",
        action="append",
        default=[],
        metavar="KEY",
        help="with --check: only the stored case with this key (repeatable)",
    )
    parser.add_argument("--base", help="the time comparison's base (default: the gate's)")
    parser.add_argument(
        "--skip-time-check",
        metavar="WHY",
        help="write without comparing time (say why; for when the comparison cannot run here)",
    )
    args = parser.parse_args()
    given = [f"--{f}" for f in ("json", "quick", "case") if getattr(args, f)]
    if given and not args.check:  # they would be ignored, and the file regenerated
        parser.error(f"{given[0]} goes with --check")
    if args.check and not Path(args.path).is_file():  # regenerating may write a new one
        parser.error(f"--path {args.path}: no such baseline file")
    if args.check:
        return check(args.path, args.json, args.quick, args.case)
    return regenerate(args.path, args.base, args.skip_time_check)


if __name__ == "__main__":
    sys.exit(main())
