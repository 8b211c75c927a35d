"""Regenerate benchmarks/baselines/deterministic.json (FLOPs, predicted and tracked peak bytes).

Run after a change that is meant to alter memory or FLOPs, review the diff, commit it:

    python benchmarks/scripts/update_baselines.py            # writes the file, prints a summary
    python benchmarks/scripts/update_baselines.py --check    # compare only; exit 1 on a difference

tests/test_benchmarks.py compares against the file (ZOO_UPDATE_BASELINES=1 makes it rewrite it).
"""

from __future__ import annotations

import argparse
import sys

from attention_zoo.measure import baseline


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--path", default=str(baseline.DEFAULT_PATH), help="baseline file (default: %(default)s)"
    )
    parser.add_argument("--check", action="store_true", help="compare only, do not write")
    args = parser.parse_args()
    if args.check:
        data = baseline.load(args.path)
        failures = 0
        for entry in data["cases"].values():
            case = baseline.BenchCase.from_dict(entry["case"])
            if reason := baseline.case_available(case):
                print(f"skip {entry['name']}: {reason}")
                continue
            problems = baseline.compare(entry, baseline.compute(case))
            failures += bool(problems)
            for p in problems:
                print(f"FAIL {entry['name']}: {p}")
        print(f"{len(data['cases'])} cases, {failures} differ")
        return 1 if failures else 0
    data = baseline.generate(args.path)
    for entry in data["cases"].values():
        print(
            f"{entry['name']:70s} {entry['flops'] / 1e9:9.3f} GFLOP  "
            f"predicted {entry['predicted_peak_bytes'] / 2**20:9.2f} MiB"
            f"  tracked {entry['tracked_peak_bytes'] / 2**20:9.2f} MiB"
        )
    print(f"wrote {args.path} ({len(data['cases'])} cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
