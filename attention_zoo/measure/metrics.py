"""The metric catalogue: every stored metric, its unit, the group that measures it, whether it is
deterministic, and how tables, the report, the baselines and the asv suite show it.

Showing a new metric is one entry here (plus the code that measures it): the bench table, the
report, the baseline comparison and the asv units all read this catalogue.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Real
from typing import Any, NamedTuple

from .units import format_bytes, format_gflop, format_number, format_seconds

# Groups MeasureSettings.metrics selects, in the order measure_case runs them.
MEASURE_GROUPS = ("time", "memory", "crosscheck", "predict", "flops", "fidelity")
FIDELITY_INPUTS = ("random", "peaked")  # input families of approx_error (measure/fidelity.py)


def approx_error_name(inputs: str) -> str:
    """The stored metric name of approx_error on one input family of FIDELITY_INPUTS."""
    return f"approx_error_{inputs}"


TASK_GROUP = "task"  # metrics of a training run (zoo task), not of a measured case


def is_measured(value: Any) -> bool:
    """Whether a stored value is a measurement: a finite number (a store holds None where there
    is none, a folder's rows.csv NaN)."""
    return isinstance(value, Real) and math.isfinite(value)


@dataclass(frozen=True, kw_only=True)
class MetricSpec:
    """One stored metric: what it is, its unit, and where and how it is shown."""

    name: str  # the store's metric name ("steps_to_" names a family: steps_to_95, ...)
    unit: str  # the stored unit (asv's track_* unit too)
    group: str  # a MEASURE_GROUPS entry (what measures it) or TASK_GROUP
    deterministic: bool  # independent of machine load, so it can be compared exactly
    label: str  # title in tables, the report and plots
    fmt: Callable[[float | None], str] = format_number  # a text-table cell from the stored value
    column: str = ""  # header in the bench table; "" = not a column there
    shown_unit: str = ""  # the unit the report shows it in ("" = the stored unit)...
    scale: float = 1.0  # ...= stored value / scale
    report: bool = False  # a column of the report's tables (time and peak memory always are)
    tolerance: float | None = None  # relative tolerance against the baseline; None: not baselined

    @property
    def display_unit(self) -> str:
        return self.shown_unit or self.unit


class Metric(NamedTuple):
    """One stored row: a metric name, its value and unit (a plain (name, value, unit) tuple)."""

    metric: str
    value: float
    unit: str


_MIB = 2**20


def _bytes(**spec: Any) -> MetricSpec:
    """A byte count: stored in bytes, shown in MiB (formatted as bytes in text tables)."""
    return MetricSpec(unit="bytes", fmt=format_bytes, shown_unit="MiB", scale=_MIB, **spec)


_CATALOGUE = (
    MetricSpec(name="time_median", unit="s", group="time", deterministic=False,
               label="time (median)", fmt=format_seconds, column="time (median)",
               shown_unit="ms", scale=1e-3, report=True),
    MetricSpec(name="time_iqr", unit="s", group="time", deterministic=False,
               label="time (interquartile range)", fmt=format_seconds, column="IQR"),
    MetricSpec(name="time_min", unit="s", group="time", deterministic=False,
               label="time (min)", fmt=format_seconds),
    MetricSpec(name="time_repeats", unit="count", group="time", deterministic=False,
               label="timed repeats"),
    MetricSpec(name="time_attempts", unit="count", group="time", deterministic=False,
               label="timings made (more than one: timed again as unstable, measure/trust.py)"),
    MetricSpec(name="free_cores", unit="cores", group="time", deterministic=False,
               label="cores other processes left free while it was timed"),
    MetricSpec(name="cpu_clock", unit="flag", group="time", deterministic=False,
               label="timed by the process's CPU time at one thread (1), not the wall clock"),
    _bytes(name="resident_bytes", group="memory", deterministic=True,
           label="resident memory (parameters, buffers, inputs, optimizer state)"),
    _bytes(name="peak_bytes", group="memory", deterministic=False,
           label="peak memory above resident (measured)", column="peak (measured)", report=True),
    _bytes(name="peak_total_bytes", group="memory", deterministic=False,
           label="peak memory including resident (measured)"),
    _bytes(name="state_bytes", group="memory", deterministic=True,
           label="decoding state per sequence (prefill, decode)", column="state", report=True),
    _bytes(name="tracked_peak_bytes", group="crosscheck", deterministic=True,
           label="peak of live tensor storages (tracked)", tolerance=0.01),
    # on the CPU beside the measured peak only (with the memory group): a step of its own
    _bytes(name="rss_peak_bytes", group="crosscheck", deterministic=False,
           label="peak RSS growth"),
    _bytes(name="predicted_peak_bytes", group="predict", deterministic=True,
           label="peak memory above resident (predicted on meta)", column="predicted", report=True,
           tolerance=0.01),
    _bytes(name="predicted_resident_bytes", group="predict", deterministic=True,
           label="resident memory (predicted)"),
    _bytes(name="predicted_total_bytes", group="predict", deterministic=True,
           label="peak memory including resident (predicted)"),
    MetricSpec(name="parameters", unit="count", group="predict", deterministic=True,
               label="parameters (counted on the meta device)"),
    MetricSpec(name="block_parameters", unit="count", group="predict", deterministic=True,
               label="parameters of one attention block (fair comparison)"),
    _bytes(name="state_bytes_per_sequence", group="predict", deterministic=True,
           label="decoding state of one sequence at the case's context (fair comparison)"),
    MetricSpec(name="flops_per_token", unit="flop", group="flops", deterministic=True,
               label="forward FLOPs per token of one block (fair comparison)",
               shown_unit="MFLOP", scale=1e6),
    MetricSpec(name="flops", unit="flop", group="flops", deterministic=True, label="FLOPs",
               fmt=format_gflop, column="GFLOP", shown_unit="GFLOP", scale=1e9, report=True,
               tolerance=0.0),
    *(MetricSpec(name=approx_error_name(inputs), unit="ratio", group="fidelity",
                 deterministic=True, label=f"approx_error vs full attention ({inputs} inputs)",
                 column=f"approx_error {inputs}", report=True, tolerance=0.05)
      for inputs in FIDELITY_INPUTS),
    MetricSpec(name="accuracy", unit="fraction", group=TASK_GROUP, deterministic=False,
               label="token accuracy"),
    MetricSpec(name="loss", unit="nats", group=TASK_GROUP, deterministic=False,
               label="evaluation loss"),
    MetricSpec(name="stop_accuracy", unit="fraction", group=TASK_GROUP, deterministic=False,
               label="accuracy on the evaluation set that stopped training (for choosing runs)"),
    MetricSpec(name="baseline_accuracy", unit="fraction", group=TASK_GROUP, deterministic=True,
               label="accuracy of the task's shallow rule (computed from its generator)"),
    MetricSpec(name="steps", unit="steps", group=TASK_GROUP, deterministic=False,
               label="training steps run"),
    MetricSpec(name="steps_to_", unit="steps", group=TASK_GROUP, deterministic=False,
               label="steps to the target accuracy"),
    MetricSpec(name="wall_time_s", unit="s", group=TASK_GROUP, deterministic=False,
               label="training wall time", fmt=format_seconds),
)  # fmt: skip
METRICS: dict[str, MetricSpec] = {m.name: m for m in _CATALOGUE}
_FAMILIES = tuple(m for m in _CATALOGUE if m.name.endswith("_"))


def metric_spec(name: str) -> MetricSpec:
    """The catalogue entry of a stored metric name ("steps_to_95", "accuracy@lsh-8" included)."""
    base = name.partition("@")[0]
    if base in METRICS:
        return METRICS[base]
    for family in _FAMILIES:
        if base.startswith(family.name):
            return family
    raise KeyError(f"metric {name!r} is not in the catalogue; known: {', '.join(METRICS)}")


def metric_row(name: str, value: float) -> Metric:
    """A stored row of a catalogued metric, its unit from the catalogue."""
    return Metric(name, value, metric_spec(name).unit)


def table_columns() -> list[MetricSpec]:
    """The metrics the bench table shows, in catalogue order."""
    return [m for m in _CATALOGUE if m.column]


def reported() -> list[MetricSpec]:
    """The metrics the report tabulates, in catalogue order."""
    return [m for m in _CATALOGUE if m.report]


def baselined() -> list[MetricSpec]:
    """The deterministic metrics compared against the committed baselines, with a tolerance."""
    return [m for m in _CATALOGUE if m.tolerance is not None]


def _check() -> None:
    for m in _CATALOGUE:
        if m.group not in (*MEASURE_GROUPS, TASK_GROUP):
            raise ValueError(f"metric {m.name!r}: unknown group {m.group!r}")
        if m.tolerance is not None and not m.deterministic:
            raise ValueError(f"metric {m.name!r}: only deterministic metrics can be baselined")


_check()
