"""Every number the report prints: formatted by one function per kind, recorded with its source.

A reference names a stored value: `[run_id, case_key, what]`, where `what` is a metric name, a
case config field (`config.seq_len`, `config.model.num_hidden_layers`) or a run field
(`run.load_start`, case_key ""). A number is either one referenced value, or derived by a named
formula from referenced values (ratio, exponent fit and its R², crossover, mean, slope, count,
share of a device's peak), or a published constant. The ledger is written beside the report
(numbers.json); the traceability test fetches every reference from the store and checks that it
gives the printed text.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..measure.metrics import metric_spec
from ..measure.units import format_percent, format_tflops, significant
from .analysis import crossover, fit_exponent, linear_slope

# kind -> formatter; a stored metric's name is a kind too: shown in the catalogue's display unit
FORMATS: dict[str, Callable[[float], str]] = {
    "ratio": lambda r: significant(r) + "x",
    "exponent": lambda e: f"{e:.2f}",
    "r2": lambda r: f"{r:.3f}",  # goodness of a fit (coefficient of determination)
    "length": lambda n: f"{n:.0f}",
    "count": lambda n: f"{n:,.0f}",
    "fraction": format_percent,
    "tflops": format_tflops,  # a FLOP rate (FLOP/s) in TFLOP/s
    "load": lambda v: f"{v:.2f}",
    "plain": significant,
}

# a number not inside a word ('lsh-4', 'x86_64' hold none); '0.23x' holds 0.23
NUMBER = re.compile(r"(?<![\w.-])-?\d+(?:,\d{3})*(?:\.\d+)?(?![\d.,]?\d)(?![a-wyzA-Z_])")


def numbers_in(text: str) -> list[str]:
    """The number tokens of `text` ('1,024', '0.23', '-1.5')."""
    return NUMBER.findall(text)


def fmt(kind: str, value: float) -> str:
    """`value` as the report prints it: a FORMATS kind, or a metric name (catalogue scale)."""
    if kind in FORMATS:
        return FORMATS[kind](value)
    return significant(value / metric_spec(kind).scale)


Ref = list[Any]  # [run_id, case_key, what]
Input = tuple[dict[str, Any], float]  # (the referenced case's config, the referenced value)


def config_value(config: dict[str, Any], path: str) -> Any:
    """`config.model.num_hidden_layers` -> config["model"]["num_hidden_layers"]."""
    value: Any = config
    for part in path.removeprefix("config.").split("."):
        value = (value or {}).get(part)
    return value


def _points(inputs: Sequence[Input], x: str) -> tuple[list[float], list[float]]:
    return [float(config_value(c, x)) for c, _ in inputs], [v for _, v in inputs]


def _crossover_length(inputs: Sequence[Input], params: dict[str, Any]) -> float:
    """A's values, then B's; with `spread`, each row's spread follows (A's, then B's), the
    points aligned: a pair within the larger spread is tied."""
    n_a, x = params["n_a"], params.get("x", "config.seq_len")
    la, va = _points(inputs[:n_a], x)
    if params.get("spread"):
        vb, sa, sb = (_points(inputs[k * n_a : (k + 1) * n_a], x)[1] for k in (1, 2, 3))
        found = crossover(la, va, vb, [max(p, q) for p, q in zip(sa, sb)])
        return found.length if found and found.length is not None else math.nan
    lb, vb = _points(inputs[n_a:], x)
    b_at = dict(zip(lb, vb))
    common = [n for n in la if n in b_at]
    a_at = dict(zip(la, va))
    found = crossover(common, [a_at[n] for n in common], [b_at[n] for n in common])
    return found.length if found and found.length is not None else math.nan


def _fit(inputs: Sequence[Input], params: dict[str, Any]) -> Any:
    return fit_exponent(*_points(inputs, params.get("x", "config.seq_len")))


# formula -> value from the inputs (in the order of the refs) and the entry's params
FORMULAS: dict[str, Callable[[Sequence[Input], dict[str, Any]], float]] = {
    "ratio": lambda i, p: i[0][1] / i[1][1],
    "exponent": lambda i, p: _fit(i, p).exponent,
    "r2": lambda i, p: _fit(i, p).r2,
    "crossover": _crossover_length,
    "mean": lambda i, p: statistics.fmean(v for _, v in i),
    "slope": lambda i, p: linear_slope(*_points(i, p["x"])),
    "count": lambda i, p: len(i),  # how many of the referenced values (e.g. times set aside)
    # FLOPs / time as a share of the peak FLOP/s in the params (measure/throughput.py)
    "peak_share": lambda i, p: i[0][1] / i[1][1] / p["peak_flops_per_s"],
}


@dataclass
class Entry:
    """One printed number: its text, kind, source and the references it was made from."""

    text: str
    kind: str  # a FORMATS key
    source: str  # value | derived | published | claims
    refs: list[Ref] = field(default_factory=list)
    formula: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    constant: str = ""  # published: the name of the paper constant


class Ledger:
    """Formats numbers for the report and remembers each one's source."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []

    def value(self, kind: str, value: float, ref: Ref) -> str:
        """One referenced value (a stored metric, a config field, a run field)."""
        text = fmt(kind, value)
        self.entries.append(Entry(text, kind, "value", [list(ref)]))
        return text

    def derive(
        self, kind: str, formula: str, inputs: Sequence[tuple[Ref, dict[str, Any], float]], **params
    ) -> tuple[float, str]:
        """(value, text) of `formula` over the referenced inputs; recorded for re-checking."""
        value = FORMULAS[formula]([(c, v) for _, c, v in inputs], params)
        text = fmt(kind, value)
        self.entries.append(
            Entry(text, kind, "derived", [list(r) for r, _, _ in inputs], formula, params)
        )
        return value, text

    def published(self, kind: str, value: float, constant: str) -> str:
        text = fmt(kind, value)
        self.entries.append(Entry(text, kind, "published", constant=constant))
        return text

    def claims(self, text: str, rows_used: str) -> str:
        """A cell of the claims module's table: kept as printed, with the rows it names."""
        self.entries.append(Entry(text, "plain", "claims", params={"rows used": rows_used}))
        return text

    def write(self, path: Path) -> None:
        path.write_text(json.dumps([asdict(e) for e in self.entries], indent=1, default=str))


def load_ledger(path: str | Path) -> list[Entry]:
    return [Entry(**e) for e in json.loads(Path(path).read_text())]


def recompute(entry: Entry, fetch: Callable[[Ref], tuple[dict[str, Any], float]]) -> str:
    """The text `entry` should have, from the values its references give through `fetch`."""
    if entry.source == "value":
        return fmt(entry.kind, fetch(entry.refs[0])[1])
    if entry.source == "derived":
        inputs = [fetch(r) for r in entry.refs]
        return fmt(entry.kind, FORMULAS[entry.formula](inputs, entry.params))
    raise ValueError(f"entry of source {entry.source!r} is not recomputed from references")
