"""When a task claim gets a verdict: the reference must clear a stated floor, every accuracy
comes from at least MIN_SEEDS seeds, and a gap is classed only when its confidence interval lies
wholly inside the band ("level") or wholly outside it ("below", "above"); else it is undecided.

The reproductions state their floors and bands; this module applies the rules the same way for
every one of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..attention.spec import BACKENDS
from ..measure.metrics import is_measured
from ..report.claims import UNDECIDED
from ..tasks.results import TRAINED
from .intervals import PERCENT, Interval, mean_interval, paired_gap

MIN_SEEDS = 3  # an accuracy claim reads at least this many seeds
LEVEL, BELOW, ABOVE = "level", "below", "above"
NOT_ABOVE = "not above"  # a one-sided class: the gap's interval lies at or below +band
NOT_BELOW = "not below"  # the one-sided class opposite BELOW: it lies at or above -band
# Why a claim has no verdict (the summary counts each as undecided).
NOT_LEARNED = f"{UNDECIDED}: the reference did not learn the task at this scale"
FEW_SEEDS = f"{UNDECIDED}: fewer than {MIN_SEEDS} seeds"
STRADDLES = f"{UNDECIDED}: the gap's interval crosses an edge of the band"
# Verdicts of rows that judge no published claim.
REFERENCE_VERDICT = "reference"  # the reference's own row
CLEARED, NOT_CLEARED = "cleared", "not cleared"  # the reference's interval above its floor, or not
OURS_ONLY = "ours only"  # a backend the paper has no row for: its gap shown, not judged
GROUPED = "grouped with full (exact)"  # an exact sibling of the reference: not compared
SIBLING_CLAIM = "exact sibling of full attention: the same function, its gap is seed noise"


def per_seed(
    rows: Iterable[Mapping[str, Any]], **where: Any
) -> tuple[dict[int, float], tuple[str, ...]]:
    """seed -> final accuracy of the tidy rows matching `where` (column -> value; by default
    eval "trained", the model as trained on the task's held-out test set; a split's label
    reads that split), and the stored cases ("run/case") it was read from."""
    where = {"eval": TRAINED, **where}
    values: dict[int, float] = {}
    refs: list[str] = []
    for r in rows:
        if r["metric"] != "accuracy" or not is_measured(r["value"]):
            continue
        if all(r[k] == v for k, v in where.items()):
            values[int(r["seed"])] = float(r["value"])
            if r.get("ref"):
                refs.append(r["ref"])
    return values, tuple(dict.fromkeys(refs))


def percent_by_backend(
    rows: Iterable[Mapping[str, Any]],
) -> tuple[dict[str, dict[int, float]], dict[str, tuple[str, ...]]]:
    """Per backend in the tidy rows: seed -> final accuracy [%] (per_seed's defaults), and the
    stored cases read."""
    read = {b: per_seed(rows, backend=b) for b in sorted({r["backend"] for r in rows})}
    accs = {b: {s: 100 * v for s, v in seeds.items()} for b, (seeds, _) in read.items()}
    return accs, {b: refs for b, (_, refs) in read.items()}


def interval_of(values: Mapping[int, float]) -> Interval | None:
    """The mean's interval over seeds, None below MIN_SEEDS seeds."""
    return mean_interval(list(values.values())) if len(values) >= MIN_SEEDS else None


def gap_of(a: Mapping[int, float], b: Mapping[int, float]) -> Interval | None:
    """The paired interval of a - b over their common seeds, None below MIN_SEEDS of them."""
    return paired_gap(a, b) if len(set(a) & set(b)) >= MIN_SEEDS else None


def gap_text(a: Mapping[int, float], b: Mapping[int, float], missing: str = "-") -> str:
    """'+1.2 [-0.4, +2.8]': the paired gap a - b and its interval; `missing` below MIN_SEEDS
    common seeds."""
    gap = gap_of(a, b)
    return missing if gap is None else gap.text(sign=True)


def gap_class(gap: Interval, band: float) -> str | None:
    """LEVEL when the interval lies within +-band, BELOW/ABOVE when wholly beyond it, else None."""
    if -band <= gap.low and gap.high <= band:
        return LEVEL
    if gap.high < -band:
        return BELOW
    if gap.low > band:
        return ABOVE
    return None


def point_class(gap: float, band: float) -> str:
    """The class of a single published gap (no interval: the paper gives one number)."""
    return LEVEL if abs(gap) <= band else BELOW if gap < 0 else ABOVE


def clears(reference: Interval | None, floor: float) -> bool:
    """Whether the reference's whole interval lies at or above the floor."""
    return reference is not None and reference.low >= floor


@dataclass(frozen=True)
class GapVerdict:
    """A mechanism's gap to the reference, judged: the class (None: undecided) and why not."""

    gap: Interval | None
    cls: str | None
    reason: str  # "" when classed, else one of the undecided reasons


def side_class(low: float, high: float, side: str, band: float) -> str | None:
    """The one-sided class of an interval [low, high] (a point: low == high): ABOVE or NOT_ABOVE
    for side ABOVE, BELOW or NOT_BELOW for side BELOW; None when it crosses the edge."""
    if side == ABOVE:
        return ABOVE if low > band else NOT_ABOVE if high <= band else None
    return BELOW if high < -band else NOT_BELOW if low >= -band else None


def interval_text(seeds: Mapping[int, float]) -> str:
    """'98.1 [96.0, 100.0]': the mean [%] and its 95% interval clipped to 0-100; '-' below
    MIN_SEEDS seeds."""
    interval = interval_of(seeds)
    return "-" if interval is None else interval.text(within=PERCENT)


def floor_state(reference: Mapping[int, float], floor: float) -> str:
    """Whether the reference's interval clears `floor`: CLEARED, NOT_CLEARED, or 'fewer than
    MIN_SEEDS seeds' (a claim's floor column)."""
    interval = interval_of(reference)
    if interval is None:
        return f"fewer than {MIN_SEEDS} seeds"
    return CLEARED if clears(interval, floor) else NOT_CLEARED


def judge_gap(
    reference: Mapping[int, float],
    other: Mapping[int, float],
    *,
    floor: float,
    band: float,
    side: str | None = None,
    learned: Mapping[int, float] | None = None,
) -> GapVerdict:
    """Class the gap other - reference against +-band (two-sided), or on one side (side ABOVE
    or BELOW: side_class), once `learned` (default: the reference) clears `floor` and the pair
    shares at least MIN_SEEDS seeds."""
    gap = gap_of(other, reference)
    learned_interval = interval_of(reference if learned is None else learned)
    if gap is None or learned_interval is None:
        return GapVerdict(gap, None, FEW_SEEDS)
    if not clears(learned_interval, floor):
        return GapVerdict(gap, None, NOT_LEARNED)
    cls = gap_class(gap, band) if side is None else side_class(gap.low, gap.high, side, band)
    return GapVerdict(gap, cls, "" if cls else STRADDLES)


def exact_siblings(reference: str, backends: Iterable[str]) -> list[str]:
    """The backends (training labels) that compute what `reference` computes, full softmax
    attention (the registry's kind "full"): their gaps to it are seed noise, so they are grouped
    with it rather than compared."""
    names = set(BACKENDS.names())
    return sorted(
        b for b in set(backends) - {reference} if b in names and BACKENDS.get(b).caps.kind == "full"
    )


@dataclass(frozen=True)
class ExtraBackend:
    """A backend trained beside a paper's rows with no row of its own: its claim line's parts."""

    backend: str
    claim: str
    verdict: str  # GROUPED (an exact sibling of the reference) or OURS_ONLY
    interval: str  # its paired gap to the reference


def extra_backends(
    accs: Mapping[str, Mapping[int, float]],
    reference: str,
    mapped: Iterable[str],
    paper: str,
    missing: str = "-",
) -> list[ExtraBackend]:
    """The backends of `accs` (backend -> seed -> accuracy) other than the reference and those
    the paper's rows name (`mapped`), by name: exact siblings of the reference grouped with it,
    the others ours only; each with its gap to the reference (`missing` below MIN_SEEDS seeds)."""
    siblings = set(exact_siblings(reference, accs))
    ref = accs.get(reference, {})
    out = []
    for backend in sorted(set(accs) - set(mapped) - {reference}):
        grouped = backend in siblings
        claim = SIBLING_CLAIM if grouped else f"accuracy, gap to full attention; no {paper} row"
        verdict = GROUPED if grouped else OURS_ONLY
        out.append(ExtraBackend(backend, claim, verdict, gap_text(accs[backend], ref, missing)))
    return out


def seed_mean(seeds: Mapping[int, float]) -> float:
    """The mean of one cell over its seeds."""
    return sum(seeds.values()) / len(seeds)


def error_bar(seeds: Mapping[int, float]) -> tuple[float, float]:
    """A cell's mean over seeds and its interval's upper half-width (0 below MIN_SEEDS seeds)."""
    mean = seed_mean(seeds)
    interval = interval_of(seeds)
    return mean, 0.0 if interval is None else interval.high - mean


def means_text(mine: Mapping[int, float], other: Mapping[int, float], *, both: bool) -> str:
    """'31.6 (+0.3)', or with both '31.6 vs 31.3 (+0.3)': mine's mean over seeds and its gap to
    other's ('-' without seeds; the mean alone when other is empty or mine itself)."""
    if not mine:
        return "-"
    a = seed_mean(mine)
    if not other or mine is other:
        return f"{a:.1f}"
    b = seed_mean(other)
    return f"{a:.1f} vs {b:.1f} ({a - b:+.1f})" if both else f"{a:.1f} ({a - b:+.1f})"


def cell_text(seeds: Mapping[int, float], scale: float = 100) -> str:
    """'98.1% [96.0, 100.0] (3 seeds)' or, below MIN_SEEDS seeds, the mean and the seed count;
    scale: the factor to percent (100 for fractions, 1 for values already in percent)."""
    interval = interval_of(seeds)
    if interval is None:
        mean = scale * seed_mean(seeds)
        return f"{mean:.1f}% ({len(seeds)} seed{'s' if len(seeds) > 1 else ''}, no interval)"
    return f"{interval.scaled(scale).text(within=PERCENT)}% ({interval.n} seeds)"


def seeds_text(*seed_sets: Mapping[int, float]) -> str:
    """'0,1,2' (the seeds every given mapping has), '-' for none."""
    common = set.intersection(*(set(s) for s in seed_sets)) if seed_sets else set()
    return ",".join(map(str, sorted(common))) or "-"


__all__ = [
    "ABOVE",
    "BELOW",
    "FEW_SEEDS",
    "GROUPED",
    "LEVEL",
    "MIN_SEEDS",
    "NOT_ABOVE",
    "NOT_BELOW",
    "NOT_LEARNED",
    "OURS_ONLY",
    "REFERENCE_VERDICT",
    "SIBLING_CLAIM",
    "STRADDLES",
    "ExtraBackend",
    "GapVerdict",
    "cell_text",
    "clears",
    "error_bar",
    "exact_siblings",
    "extra_backends",
    "floor_state",
    "gap_class",
    "gap_of",
    "gap_text",
    "interval_of",
    "interval_text",
    "judge_gap",
    "means_text",
    "per_seed",
    "percent_by_backend",
    "point_class",
    "seed_mean",
    "seeds_text",
    "side_class",
]
