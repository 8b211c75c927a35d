"""Grazzi et al. 2025's parity claims: a delta rule with negative eigenvalues learns parity and
keeps it past its training length; with eigenvalues in [0, 1] (gated-deltanet's default step
sizes, gla's decays, linear attention's identity transition) a linear recurrence does not.

Accuracy is read per length range: the training length (the task's held-out test set), then each
test split past it. The reference, gated-deltanet with negative eigenvalues, holds its claim when
its interval over seeds clears FLOOR at every range. A contrast is judged by its paired gap to the
reference at each range where the reference cleared FLOOR (there the scale learned parity and kept
it): below at one of them, the contrast's claim holds; level at every range refutes it only where
the reference cleared FLOOR at all of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ...report.claims import FAILS, HOLDS, NOT_MEASURED, UNDECIDED, ClaimRow
from ...tasks.results import TRAINED
from ...tasks.suite import TaskPreset
from ..evidence import (
    BELOW,
    FEW_SEEDS,
    MIN_SEEDS,
    clears,
    interval_of,
    judge_gap,
    per_seed,
    seed_mean,
    seeds_text,
)
from ..intervals import PERCENT, Interval
from .presets import DELTA_RULE, TASK, base_name, negative_name, scale_text

SOURCE = (
    'Grazzi et al. 2025, "Unlocking State-Tracking in Linear RNNs Through Negative Eigenvalues" '
    "(ICLR): Figure 1 and the parity column of the Chomsky-hierarchy results (trained on lengths "
    "<= 40, tested on 40-256, 3 seeds), Theorem 1; code: adankow/unlocking_state_tracking"
)
FLOOR = 90.0  # accuracy [%] counted as parity tracked over a length range (chance: 50)
BAND = 10.0  # points: a contrast this far below the reference at a range falls short there
NOT_LEARNED = f"{UNDECIDED}: it did not learn parity at the training length at this scale"
CROSSES = f"{UNDECIDED}: an interval crosses the floor"
REFERENCE_NOT_LEARNED = (
    f"{UNDECIDED}: the reference (negative eigenvalues) did not learn parity at the training "
    "length here"
)
REFERENCE_MISSING = f"{UNDECIDED}: the reference (negative eigenvalues) is not measured"
LEVEL_WHERE_KEPT = (
    f"{UNDECIDED}: level with the reference where it kept parity; past there it did not keep "
    "parity either"
)


@dataclass(frozen=True, kw_only=True)
class Mechanism:
    """One line of the claims: a backend trained in one of the two presets."""

    name: str  # how the claims and the table name it
    backend: str
    negative: bool  # trained in the copy with gated-deltanet's negative eigenvalues
    claim: str
    published: str


THEOREM_1 = "Theorem 1: no finite-precision LRNN with only non-negative eigenvalues solves parity"
REFERENCE = Mechanism(
    name="gated-deltanet [-1, 1]",
    backend=DELTA_RULE,
    negative=True,
    claim=(
        "gated-deltanet with negative eigenvalues (step sizes in (0, 2)) learns parity and keeps "
        "it at every test length past its training length"
    ),
    published=(
        "a perfect score at lengths 40-256 once the eigenvalue range is [-1, 1] (Figure 1: "
        "diagonal LRNNs; the parity results: DeltaNet)"
    ),
)
CONTRASTS = (
    Mechanism(
        name="gated-deltanet [0, 1]",
        backend=DELTA_RULE,
        negative=False,
        claim="with eigenvalues in [0, 1] (step sizes in (0, 1)) gated-deltanet does not",
        published=(
            "random guessing past the training length with the range [0, 1] (Figure 1; the "
            "parity results: DeltaNet [0, 1]); Theorem 1"
        ),
    ),
    Mechanism(
        name="gla",
        backend="gla",
        negative=False,
        claim="gla (decays in (0, 1): eigenvalues in [0, 1]) does not",
        published=THEOREM_1,
    ),
    Mechanism(
        name="linear",
        backend="linear",
        negative=False,
        claim="linear attention (the identity transition: eigenvalue 1) does not",
        published=THEOREM_1,
    ),
)
MECHANISMS = (REFERENCE, *CONTRASTS)
REFERENCE_RULE = (
    f"at each length range (the training length, then each test split) the 95% interval of the "
    f"accuracy over >= {MIN_SEEDS} seeds; holds: at or above {FLOOR:g}% at every range; does not "
    f"hold: learned at the training length, wholly below {FLOOR:g}% at a test range; else "
    "undecided"
)
CONTRAST_RULE = (
    f"judged at each length range where the reference's interval clears {FLOOR:g}% (there the "
    f"scale learned parity and kept it): the paired gap mechanism - reference over >= {MIN_SEEDS} "
    f"seeds, its 95% interval classed below (wholly beyond -{BAND:g} points) or level (within "
    f"+-{BAND:g}); holds: below at some such range; does not hold: level (or above) at every "
    f"range, the reference having cleared {FLOOR:g}% at all of them; else undecided"
)

Cells = dict[str, dict[int, float]]  # stored eval label -> seed -> accuracy [%]


def ranges(preset: TaskPreset) -> list[tuple[str, str]]:
    """(stored eval label, scored positions) of each length range, the training length first."""
    task = preset.task
    return [(TRAINED, f"{task.score_from}-{task.seq_len - 1}")] + [
        (label, f"{split.score_from}-{split.seq_len - 1}")
        for label, split in task.eval_splits().items()
    ]


def accuracies(
    rows: Iterable[Mapping[str, Any]], size: str, mechanism: Mechanism, labels: Iterable[str]
) -> tuple[Cells, tuple[str, ...]]:
    """Eval label -> seed -> accuracy [%] of `mechanism` at `size`, and the stored cases read."""
    rows = list(rows)
    preset = negative_name(size) if mechanism.negative else base_name(size)
    cells: Cells = {}
    refs: list[str] = []
    for label in labels:
        seeds, used = per_seed(
            rows, task=TASK, preset=preset, backend=mechanism.backend, eval=label
        )
        if seeds:
            cells[label] = {s: 100 * v for s, v in seeds.items()}
            refs += used
    return cells, tuple(dict.fromkeys(refs))


def judge_reference(cells: Cells, labels: list[str]) -> str:
    """The reference's verdict from its accuracies per range (labels: the training one first)."""
    if not cells:
        return NOT_MEASURED
    intervals = [interval_of(cells.get(label, {})) for label in labels]
    if any(i is None for i in intervals):
        return FEW_SEEDS
    if not clears(intervals[0], FLOOR):
        return NOT_LEARNED
    if all(clears(i, FLOOR) for i in intervals):
        return HOLDS
    if any(i is not None and i.high < FLOOR for i in intervals[1:]):
        return FAILS
    return CROSSES


def judge_contrast(
    cells: Cells, reference: Cells, labels: list[str], reference_verdict: str
) -> tuple[str, dict[str, str]]:
    """A contrast's verdict and, per range it could judge (one where the reference cleared the
    floor), its gap's text with its class."""
    if not cells:
        return NOT_MEASURED, {}
    if reference_verdict in (FEW_SEEDS, NOT_MEASURED, NOT_LEARNED):
        reasons = {FEW_SEEDS: FEW_SEEDS, NOT_MEASURED: REFERENCE_MISSING}
        return reasons.get(reference_verdict, REFERENCE_NOT_LEARNED), {}
    judged = {
        label: judge_gap(reference[label], cells.get(label, {}), floor=FLOOR, band=BAND)
        for label in labels
        if clears(interval_of(reference.get(label, {})), FLOOR)
    }
    texts = {
        label: j.gap.text(sign=True) + (f" ({j.cls})" if j.cls else "")
        for label, j in judged.items()
        if j.gap is not None
    }
    if not judged:
        return REFERENCE_NOT_LEARNED, {}
    if any(j.cls == BELOW for j in judged.values()):
        return HOLDS, texts
    if not all(j.cls for j in judged.values()):
        return next(j.reason for j in judged.values() if not j.cls), texts
    # level where the reference kept parity refutes "does not keep it" only if it kept it everywhere
    return (FAILS if len(judged) == len(labels) else LEVEL_WHERE_KEPT), texts


def claims(rows: Iterable[Mapping[str, Any]], size: str, preset: TaskPreset) -> list[ClaimRow]:
    """The reference's claim, then one per contrast, at `size` (`preset`: its suite preset)."""
    rows = list(rows)
    spans = ranges(preset)
    labels = [label for label, _ in spans]
    where = dict(spans)
    scale = scale_text(preset)
    cells = {m.name: accuracies(rows, size, m, labels) for m in MECHANISMS}
    ref_cells, ref_used = cells[REFERENCE.name]
    ref_verdict = judge_reference(ref_cells, labels)
    ref_intervals = {label: interval_of(ref_cells.get(label, {})) for label in labels}
    cleared = [where[k] for k, i in ref_intervals.items() if clears(i, FLOOR)]
    floor = (
        f"reference >= {FLOOR:g}% per range (chance 50%; its own claim: every range; the "
        "contrasts are judged where it cleared): cleared at " + (", ".join(cleared) or "none")
    )

    def line(m: Mechanism, verdict: str, interval: str) -> ClaimRow:
        mine, used = cells[m.name]
        measured = verdict != NOT_MEASURED
        return ClaimRow(
            claim=m.claim,
            setting=f"parity, preset {size}, {m.name} ({m.backend}), no position embeddings",
            scale=scale,
            published=m.published,
            ours=_ours(mine, spans),
            interval=interval,
            floor=floor,
            seeds=seeds_text(*mine.values(), *([] if m is REFERENCE else ref_cells.values()))
            if mine
            else "-",
            rule=(REFERENCE_RULE if m is REFERENCE else CONTRAST_RULE) if measured else "-",
            verdict=verdict,
            rows_used=tuple(dict.fromkeys(used + (() if m is REFERENCE else ref_used))),
        )

    out = [line(REFERENCE, ref_verdict, _intervals_text(ref_intervals, where))]
    for m in CONTRASTS:
        verdict, gaps = judge_contrast(cells[m.name][0], ref_cells, labels, ref_verdict)
        interval = "; ".join(f"{where[k]}: {t}" for k, t in gaps.items()) or "-"
        out.append(line(m, verdict, interval))
    return out


def _ours(cells: Cells, spans: list[tuple[str, str]]) -> str:
    """'1-39: 100.0; 40-79: 99.8; ...': the mean accuracy [%] over seeds per range."""
    parts = [f"{text}: {seed_mean(cells[k]):.1f}" for k, text in spans if cells.get(k)]
    return "; ".join(parts) or "-"


def _intervals_text(intervals: Mapping[str, Interval | None], where: Mapping[str, str]) -> str:
    parts = [f"{where[k]}: {i.text(within=PERCENT)}" for k, i in intervals.items() if i]
    return "; ".join(parts) or "-"
