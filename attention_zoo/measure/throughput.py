"""The FLOP rate a case achieved and its share of the device's dense peak: derived where rows are
read, never stored, one definition for `zoo bench`, `zoo results` and the report.

rate = flops / time_median: the FLOPs counted for one measured step (the `flops` metric: torch's
flop formulas over the step, so forward+backward and train-step count their backward too,
flops.py) over that step's median time. It is the counter's count, not the work a kernel chose to
do: causal fused attention (SDPA) is counted as the full n x n product while its kernels skip the
masked half, so a causal SDPA rate reads about twice the useful one; FLOPs the counter does not
see (custom kernels) and element-wise work are not counted. A share above 100% says that the
count exceeds what the kernel computed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .metrics import is_measured
from .peaks import Peak, device_peak, known_models
from .units import format_percent, format_tflops

# The derived rows `zoo results` adds to its CSV and JSON (metric names never stored).
FLOP_RATE, PEAK_SHARE = "flop_rate", "peak_share"
DERIVED = (FLOP_RATE, PEAK_SHARE)
RATE_HEADER, SHARE_HEADER = "TFLOP/s", "% peak"  # their columns in every table
PEAK_UNKNOWN = "unknown"  # a share's cell where the device's peak for the dtype is not known
RATE_LABEL = (
    "the counted FLOPs of one step (torch's flop formulas, backward included; causal fused "
    "attention counted as the full product) / its median time"
)
SHARE_LABEL = (
    "its share of the device's dense peak for the dtype (measure/peaks.py; float32: the CUDA-core "
    f"peak unless TF32 was allowed), {PEAK_UNKNOWN} where that peak is not known (a CPU's never is)"
)
RATE_RULE = f"{RATE_HEADER}: {RATE_LABEL}; {SHARE_HEADER}: {SHARE_LABEL}"
OVER_PEAK = (
    "a share above the peak: more FLOPs counted than the kernel computed (a causal or sparse "
    "kernel counted dense, or float32 run on tensor cores)"
)


@dataclass(frozen=True)
class Throughput:
    """One case's counted FLOPs, its median time and the device's peak (None: not known)."""

    flops: float
    seconds: float
    peak: Peak | None

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.seconds

    @property
    def share(self) -> float | None:
        return None if self.peak is None else self.flops_per_s / self.peak.flops_per_s


def throughput(
    metrics: Mapping[str, float], *, device: str, device_name: str, dtype: str, tf32: bool | None
) -> Throughput | None:
    """The rate of a case with a FLOP count and a median time (None without both, or with none
    counted); its peak only on CUDA, where device_name is the GPU's (tf32: measure/peaks.py)."""
    flops, seconds = metrics.get("flops"), metrics.get("time_median")
    if not flops or not seconds or flops < 0 or seconds < 0:
        return None
    on_cuda = device.split(":")[0] == "cuda"
    peak = device_peak(device_name, dtype, tf32=tf32) if on_cuda else None
    return Throughput(float(flops), float(seconds), peak)


def environment_of(case: Mapping[str, Any]) -> dict[str, Any]:
    """A case's stored environment (JSON text or a dict; {} when it has none)."""
    env = case.get("environment")
    if isinstance(env, str):
        return json.loads(env) if env else {}
    return dict(env) if isinstance(env, Mapping) else {}


def case_throughput(case: Mapping[str, Any]) -> Throughput | None:
    """The rate of a case as measure.table.group_cases groups it (a report frame row too)."""
    config = case["config"]
    return throughput(
        case["metrics"],
        device=str(config.get("device", "cpu")),
        device_name=str(case.get("device_name") or ""),
        dtype=str(config.get("dtype", "")),
        tf32=environment_of(case).get("cuda_matmul_tf32"),
    )


def rate_cell(found: Throughput | None) -> str:
    return format_tflops(None if found is None else found.flops_per_s)


def share_cell(found: Throughput | None) -> str:
    if found is None:
        return "-"
    return PEAK_UNKNOWN if found.share is None else format_percent(found.share)


def rate_notes(cases: Iterable[Mapping[str, Any]]) -> list[str]:
    """The lines a table of cases adds below itself: what the rate columns are, where a peak is
    not known and why, and a share above 100%."""
    found = [(c, t) for c in cases if (t := case_throughput(c)) is not None]
    if not found:
        return []
    notes = [RATE_RULE]
    unknown = sorted({str(c.get("device_name") or "?") for c, t in found if t.peak is None})
    if unknown:
        notes.append(
            f"% peak {PEAK_UNKNOWN} on {', '.join(unknown)}: no dense peak known for that device "
            f"and dtype (known: {', '.join(known_models())}; a CPU has none)"
        )
    if any(t.share is not None and t.share > 1 for _, t in found):
        notes.append(OVER_PEAK)
    return notes


def derived_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Export rows (ResultStore.rows()) of each case's FLOP_RATE (flop/s) and, where its peak is
    known, PEAK_SHARE (the unit names the peak), beside its time_median row's fields."""
    by_case: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        case = by_case.setdefault((r["run_id"], r["case_key"]), {"metrics": {}})
        if r["metric"] in ("flops", "time_median") and is_measured(r["value"]):
            case["metrics"][r["metric"]] = r["value"]
            if r["metric"] == "time_median":
                case["row"] = r
    out = []
    for case in by_case.values():
        if "row" not in case:
            continue
        row = case["row"]
        config = json.loads(row["config"]) if isinstance(row["config"], str) else row["config"]
        found = case_throughput({**row, "config": config, "metrics": case["metrics"]})
        if found is None:
            continue
        out.append({**row, "metric": FLOP_RATE, "value": found.flops_per_s, "unit": "flop/s"})
        if found.share is not None:
            unit = f"fraction of {found.peak.describe()}"
            out.append({**row, "metric": PEAK_SHARE, "value": found.share, "unit": unit})
    return out
