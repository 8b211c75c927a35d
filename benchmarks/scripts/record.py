"""Record HEAD's numbers on this machine in the published asv results: a subset of the suite on
one device, run in a clean environment of HEAD (benchmarks/scripts/sides.py: HEAD's package from
git, this interpreter's torch), stored in reports/asv-results/<machine>/ for
benchmarks/scripts/publish.py to turn into reports/asv/.

    python benchmarks/scripts/record.py --device cuda            # the CUDA subset: each backend's
                                                                 # block, forward+backward, 1k, 4k
    python benchmarks/scripts/record.py --device cuda --dry-run  # what it would run, nothing run
    python benchmarks/scripts/record.py --device cpu --bench 'Time.time_step.*attention.*local'

Before it runs, it checks that a process forked after the suite's import can still use the device
(asv's forkserver imports the suite once and forks per benchmark): if not, it says so and runs with
torch's NVML-based CUDA check (PYTORCH_NVML_BASED_CUDA_CHECK=1) if that lets a fork use CUDA, else
with asv's spawn launch method (a fresh interpreter per benchmark: minutes more, always safe).
Exit 0 when every selected benchmark ran or was n/a, 1 when some failed (their output shown), 2
when nothing could be recorded.
"""

from __future__ import annotations

import argparse
import math
import platform
import re
import shlex
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gate  # sibling scripts
import plumbing
import sides

RECORD_DIR = Path(".asv") / "record"  # the clean environment and the derived configuration
LENGTHS = (1024, 4096)
# Few samples: a record is one point of the history, not a comparison (about 1-2 min on an H100).
SAMPLING = {"repeat": "(3,10,2.0)", "warmup_time": "0.2"}


def subset(device: str) -> list[str]:
    """The recorded subset on `device`: every backend's SelfAttention block, forward+backward, at
    1,024 and 4,096 tokens: its time and its measured peak."""
    n = "|".join(str(length) for length in LENGTHS)
    rest = rf"'block', '[^']+', ({n}), 'forward\+backward'\)$"
    return [
        rf"^bench_attention\.Time\.time_step\('{device}', 1, {rest}",
        rf"^bench_attention\.Memory\.track_peak_bytes\('{device}', {rest}",
    ]


def default_machine(device: str) -> str:
    """asv's machine name: the GPU's name for CUDA (every machine with that GPU files its numbers
    in one series), the host's otherwise."""
    if device == "cuda":
        import torch

        if torch.cuda.is_available():
            return "cuda-" + re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(0).lower())
    return platform.node() or "local"


def run_args(
    side: sides.Side, conf: Path, machine: str, bench: Sequence[str], launch: sides.Launch
) -> list[str]:
    args = ["run", "--config", str(conf), "--machine", machine]
    args += ["--environment", f"existing:{side.python}", "--set-commit-hash", side.commit]
    args += ["--launch-method", launch.method, "--show-stderr", "-a", "rounds=1"]
    for key, value in SAMPLING.items():
        args += ["-a", f"{key}={value}"]
    for regex in bench:
        args += ["--bench", regex]
    return args


def stored(results: Path, machine: str, commit: str) -> tuple[int, int]:
    """(finite values, failed) stored for `commit` on `machine` (asv stores n/a, and a parameter
    combination not selected, as NaN: neither is counted)."""
    from asv.results import iter_results_for_machine_and_hash

    finite = failed = 0
    for res in iter_results_for_machine_and_hash(str(results), machine, commit):
        for name in res.get_all_result_keys():
            for value in plumbing.labelled_values(res, name).values():
                if value is None:
                    failed += 1
                elif not math.isnan(value):
                    finite += 1
    return finite, failed


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", choices=gate.DEVICES, required=True)
    parser.add_argument(
        "--bench", action="append", default=[], help="asv regex instead of the default subset"
    )
    parser.add_argument("--machine", help="asv machine name (default: cuda-<GPU name>, or host)")
    parser.add_argument(
        "--results-dir", type=Path, help="where results go (default: asv.conf.json's results_dir)"
    )
    parser.add_argument("--config", type=Path, default=plumbing.ROOT / "asv.conf.json")
    parser.add_argument("--dry-run", action="store_true", help="print the asv commands only")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    try:
        conf = plumbing.load_asv_config(args.config)
    except plumbing.GateError as exc:
        print(f"record: error: {exc}", file=sys.stderr)
        return 2
    machine = args.machine or default_machine(args.device)
    results = (args.results_dir or plumbing.ROOT / conf["results_dir"]).resolve()
    bench = args.bench or subset(args.device)
    head = plumbing.commit_of("HEAD")
    folder = plumbing.ROOT / RECORD_DIR
    conf_path = folder / "asv.conf.json"
    if args.dry_run:
        side = sides.Side(head, folder / "env")
        print(
            f"record: would build a clean environment of HEAD ({plumbing.short(head)}) "
            f"in {side.folder}"
        )
        for cmd in (
            ["machine", "--yes", "--machine", machine],
            run_args(side, conf_path, machine, bench, sides.Launch()),
        ):
            print("record: would run: asv " + shlex.join(cmd))
        print(f"record: results would go to {results / machine}")
        return 0
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("record: error: --device cuda: no CUDA device is visible here", file=sys.stderr)
            return 2
    if plumbing.git("status", "--porcelain", "--untracked-files=no"):
        print("record: note: uncommitted changes are not recorded (HEAD's files are)")
    shutil.rmtree(folder, ignore_errors=True)
    try:
        side = sides.build_side(plumbing.ROOT, head, folder / "env")
    except sides.SideError as exc:
        print(f"record: error: {exc}", file=sys.stderr)
        return 2
    launch = sides.launch_for(side, plumbing.ROOT / conf["benchmark_dir"], args.device)
    if launch.why:
        print(
            f"record: a process forked after the suite's import cannot use {args.device} "
            f"({launch.why}): asv runs with --launch-method {launch.method} {launch.env or ''}"
        )
    plumbing.derived_config(conf, results, conf_path)
    plumbing.ensure_machine(machine)
    code, _ = plumbing.asv(*run_args(side, conf_path, machine, bench, launch), env=launch.env)
    finite, failed = stored(results, machine, head)
    print(
        f"record: {finite} result(s), {failed} failed for {plumbing.short(head)} in "
        f"{results / machine} ({time.monotonic() - started:.0f} s, launch method {launch.method}); "
        "publish with: python benchmarks/scripts/publish.py"
    )
    if finite == 0:
        print(f"record: error: nothing recorded (asv exit {code})", file=sys.stderr)
        return 2
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
