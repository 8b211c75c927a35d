"""`zoo memory`: predicted memory (and FLOPs) for any length and device, allocating nothing."""

from __future__ import annotations

import argparse
import json

from ..argtypes import size
from ..errors import ZooError
from ..measure.cases import BenchCase, build_runnable
from ..measure.labels import case_label
from ..measure.memory import profiled_peak
from ..measure.predict import predict_case, stand_in_device
from ..measure.runner import describe_error, is_oom
from ..measure.table import CASE_HEADERS, case_cells, format_table
from ..measure.units import format_bytes
from ..presets import builtin_presets
from ..progress import progress
from ..sweep import default_memory_limit
from .bench_cmd import add_grid_arguments, check_options_used, grid_from_args
from .parsers import add_command

HELP = "predict memory for given lengths/devices (does it fit in N GB?)"
DESCRIPTION = "Predict peak memory, resident memory and FLOPs of each case; nothing is allocated."
EXAMPLE = """examples:
  zoo memory --backends full,lsh,local --lengths 4096,65536,524288 \\
             --modes forward+backward --fits 8GiB
      does forward+backward of each backend's SelfAttention fit in 8 GiB at these lengths?
  zoo memory --preset crime-and-punishment --fits 8GB
      one training step of the crime-and-punishment shaped ReformerLM at 524,288 tokens
  zoo memory --preset quick --check
      also measure each case here (CPU profiler) and print measured / predicted

Predictions run the case on shapes only (the meta device; FakeTensors for CUDA): no memory is
allocated, any length works, and a CUDA target can be predicted on a machine without a GPU (CPU
kernels then stand in, which the 'method' column says). They cannot see memory kernels allocate
internally (scratch), so a measured number can be a little higher; see --check. Sizes: 8GB = 8e9
bytes, 8GiB = 8 * 2^30, a bare number means GiB. Built-in presets: %(presets)s.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    epilog = EXAMPLE % {"presets": ", ".join(builtin_presets())}
    p = add_command(sub, "memory", HELP, DESCRIPTION, epilog)
    add_grid_arguments(p)
    p.add_argument(
        "--fits", type=size, help="memory budget, e.g. 8GiB or 8GB: adds a 'fits' column"
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="also measure each CPU case that fits in memory here, and print measured/predicted",
    )
    p.add_argument(
        "--format",
        choices=["table", "json"],
        default="table",
        help="output format (default: table)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    grid, _ = grid_from_args(args, devices_present=False)  # a CUDA case is predicted anywhere
    cases = grid.cases()
    check_options_used(args, cases)
    budget = args.fits
    bar = progress(len(cases), desc="memory", unit="cases", leave=False)  # on stderr
    records = []
    for case in cases:
        bar.set_postfix_str(case.name())
        records.append(_predict(case, args.check))
        bar.update()
    bar.close()
    if args.format == "json":
        for r in records:
            if budget is not None and r.get("total_bytes") is not None:
                r["fits"] = r["total_bytes"] <= budget
        print(json.dumps(records, indent=2))
        return 0
    headers = [
        *CASE_HEADERS,
        "device",
        "peak (predicted)",
        "resident",
        "total",
        "GFLOP",
    ]
    if budget is not None:
        headers.append(f"fits {format_bytes(budget)}")
    if args.check:
        headers += ["measured peak", "meas/pred"]
    headers.append("method")
    rows = []
    for r in records:
        c = r["case"]
        line = [*case_cells(c), c["device"]]
        if "error" in r:
            line += ["-", "-", "-", "-"] + (["?"] if budget is not None else [])
        else:
            line += [
                format_bytes(r["peak_bytes"]),
                format_bytes(r["resident_bytes"]),
                format_bytes(r["total_bytes"]),
                f"{r['flops'] / 1e9:.2f}",
            ]
            if budget is not None:
                line.append("yes" if r["total_bytes"] <= budget else "NO")
        if args.check:
            meas = r.get("measured_peak_bytes")
            line += [
                format_bytes(meas) if meas is not None else r.get("check", "-"),
                f"{meas / r['peak_bytes']:.3f}" if meas and r.get("peak_bytes") else "-",
            ]
        line.append(r.get("method", "not predicted (below)"))
        rows.append(line)
    print(format_table(headers, rows, right=range(2, 4)))
    errors: dict[tuple[str, str], list[str]] = {}
    for r in records:
        if "error" in r:
            errors.setdefault((case_label(r["case"]), r["error"]), []).append(
                f"L={r['case']['seq_len']}"
            )
    if errors:
        print(
            "\nnot predicted:\n"
            + "\n".join(
                f"  {what} ({', '.join(where)}): {error}" for (what, error), where in errors.items()
            )
        )
    return 0


def _predict(case: BenchCase, check: bool) -> dict:
    record: dict = {"case": case.to_dict()}
    if reason := _skip_reason(case):
        record["error"] = f"skipped: {reason}"
        return record
    try:
        p = predict_case(case)
    except Exception as exc:
        record["error"] = describe_error(exc)
        return record
    record.update(
        peak_bytes=p.peak_bytes,
        resident_bytes=p.resident_bytes,
        total_bytes=p.total_bytes,
        flops=p.flops,
        method=p.method,
    )
    if check:
        record.update(_check(case, p.total_bytes))
    return record


def _skip_reason(case: BenchCase) -> str | None:
    try:
        return case.unsupported(stand_in_device(case.device))
    except ZooError as exc:
        return str(exc)


def _check(case: BenchCase, predicted_total: int) -> dict:
    """Measure the case's peak on CPU with the profiler, if it safely fits."""
    if case.device != "cpu":
        return {"check": "cpu only"}
    limit = default_memory_limit()
    if limit is not None and predicted_total > limit:
        return {"check": "too big here"}
    if reason := case.unsupported():
        return {"check": reason}
    try:
        runnable = build_runnable(case)
        runnable.step()
        _, peak = profiled_peak(runnable.step)
    except Exception as exc:
        return {"check": "oom" if is_oom(exc) else describe_error(exc)[:60]}
    return {"measured_peak_bytes": peak.peak_bytes}
