"""Regenerate the published asv history: `asv publish` from the stored results into reports/asv/.

    python benchmarks/scripts/publish.py

Results are stored (and committed) in reports/asv-results/ by benchmarks/scripts/record.py
(docs/regression.md); the HTML goes to reports/asv/ (open reports/asv/index.html, or `asv
preview`). Each machine is its own series, and within one the `device` parameter tells CPU results
from CUDA ones.

asv rewrites each machine's machine.json on every run, so it is not committed (.gitignore); asv
publish skips a machine without one, so a missing one is written here from the machine facts every
stored result carries (its "params").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import plumbing  # the sibling script: asv configuration and runner


def stored_results(results_dir: Path) -> list[Path]:
    """Result files of every machine (benchmarks.json and machine.json are not results)."""
    return [
        p for p in results_dir.glob("*/*.json") if p.name not in ("machine.json", "benchmarks.json")
    ]


MACHINE_FIELDS = ("arch", "cpu", "machine", "num_cpu", "os", "ram")  # asv's machine.json (v1)


def restore_machine_files(results_dir: Path) -> list[Path]:
    """Write the machine.json of each machine folder that has results but none; returns them."""
    written = []
    for folder in sorted({p.parent for p in stored_results(results_dir)}):
        target = folder / "machine.json"
        if target.exists():
            continue
        newest = max(folder.glob("*.json"), key=lambda p: json.loads(p.read_text()).get("date", 0))
        params = json.loads(newest.read_text())["params"]
        machine = {k: params[k] for k in MACHINE_FIELDS if k in params}
        target.write_text(json.dumps({**machine, "version": 1}, indent=4, sort_keys=True))
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--config", type=Path, default=plumbing.ROOT / "asv.conf.json", help="asv configuration"
    )
    args = parser.parse_args(argv)
    try:
        conf = plumbing.load_asv_config(args.config)
    except plumbing.GateError as exc:
        print(f"publish: error: {exc}", file=sys.stderr)
        return 2
    results_dir = plumbing.ROOT / conf["results_dir"]
    if not stored_results(results_dir):
        print(
            f"publish: error: no stored results in {results_dir}; record some first: "
            "python benchmarks/scripts/record.py (docs/regression.md)",
            file=sys.stderr,
        )
        return 2
    for path in restore_machine_files(results_dir):
        print(f"publish: wrote {path} from its stored results")
    code, _ = plumbing.asv("publish", "--config", str(args.config))
    if code != 0:
        print(f"publish: error: asv publish failed (exit {code}, above)", file=sys.stderr)
        return 2
    print(f"publish: wrote {plumbing.ROOT / conf['html_dir']} from {results_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
