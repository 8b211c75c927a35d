"""LRA ListOps (Tay et al. 2021, Table 1): every bidirectional backend trained on the listops task,
beside LRA's published accuracies.

The sequences, model and budget differ from LRA's, so cells are not compared: each mechanism's
gap to full attention is, over seeds, its interval classed level with it, below or above. A gap
is judged only when full attention learned more than a shallow rule: its accuracy interval must
clear the root-operator rule (computed from the generator, stored with each run) plus MARGIN.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ...measure.metrics import is_measured
from ...report.claims import FAILS, HOLDS, NOT_MEASURED, UNDECIDED, ClaimRow
from ..evidence import (
    FEW_SEEDS,
    MIN_SEEDS,
    NOT_CLEARED,
    REFERENCE_VERDICT,
    extra_backends,
    floor_state,
    gap_text,
    interval_text,
    judge_gap,
    means_text,
    percent_by_backend,
    point_class,
    seeds_text,
)
from .settings import TASK

REFERENCE = "full"
SOURCE = "Long Range Arena (Tay et al. 2021), Table 1, ListOps accuracy [%]"
# LRA's model -> its accuracy [%]
PUBLISHED = {
    "Transformer": 36.37,
    "Local Attention": 15.82,
    "Reformer": 37.27,
    "Performer": 18.01,
    "Linformer": 35.70,
    "BigBird": 36.05,
    "Longformer": 35.63,
    "Linear Trans.": 16.13,
}
# LRA's model -> the backend (training-variant label) that implements its mechanism here
OURS = {
    "Transformer": REFERENCE,
    "Local Attention": "local",
    "Reformer": "lsh-1",
    "Performer": "performer",
    "Linformer": "linformer",
    "BigBird": "bigbird",
    "Longformer": "sliding-window",
    "Linear Trans.": "linear",
}
LEVEL_BAND = 3.0  # points: a gap whose interval lies within +-3 is "level"; wholly below, "below"
MARGIN = 5.0  # points above the root-operator rule that full attention must clear
BASELINE = "baseline_accuracy"  # the stored metric: the root-operator rule's accuracy
NO_FLOOR = f"{UNDECIDED}: no floor stored with these runs (train them again to store it)"
# Why the cpu size decides nothing, shown beside its floor when full attention misses it.
NO_CPU_PRESET = (
    "no preset of cpu size lets full attention clear it on nested expressions "
    "(docs/tasks.md, ListOps at cpu scale)"
)
RULE = (
    f"the gap to full attention over >= {MIN_SEEDS} seeds (paired by seed), its 95% interval "
    f"classed level (inside +-{LEVEL_BAND:g} points), below or above (wholly outside), else "
    "undecided; judged only when full attention's interval clears the floor; holds when the "
    "class is LRA's (LRA's gap classed by the same band)"
)


def baseline(rows: Iterable[Mapping[str, Any]]) -> float | None:
    """The root-operator rule's accuracy [%] stored with the runs (None: not stored)."""
    found = {float(r["value"]) for r in rows if r["metric"] == BASELINE and is_measured(r["value"])}
    return 100 * max(found) if found else None


def claims(
    rows: Iterable[Mapping[str, Any]],
    preset: str,
    setting: str = "",
    scale: str = "-",
    uncleared: str = "",
) -> list[ClaimRow]:
    """One line per LRA model (its gap to the Transformer, LRA's beside ours), then our other
    backends; `setting` names whose attention options ran, `scale` the preset's size, and
    `uncleared` why that size's floor is not cleared, when it is not."""
    rows = [r for r in rows if r["task"] == TASK and r["preset"] == preset]
    accs, refs = percent_by_backend(rows)
    reference = accs.get(REFERENCE, {})
    base = baseline(rows)
    floor = None if base is None else base + MARGIN
    floor_text = "-"
    if floor is not None:
        cleared = floor_state(reference, floor)
        floor_text = f"full >= {floor:.1f} (root-operator rule {base:.1f} + {MARGIN:g}): {cleared}"
        if cleared == NOT_CLEARED and uncleared:
            floor_text += f"; {uncleared}"
    where = f"listops, preset {preset}" + (f", {setting}" if setting else "")

    def line(claim: str, backend: str, published: str, verdict: str, **kw: Any) -> ClaimRow:
        mine = accs.get(backend, {})
        used = refs.get(backend, ()) + (refs.get(REFERENCE, ()) if backend != REFERENCE else ())
        return ClaimRow(
            claim=claim,
            setting=f"{where}, backend {backend}",
            scale=scale,
            published=published,
            ours=means_text(mine, reference, both=False),
            floor=floor_text,
            seeds=seeds_text(mine, reference) if mine else "-",
            rule=kw.pop("rule", RULE),
            verdict=verdict,
            rows_used=tuple(dict.fromkeys(used)),
            **kw,
        )

    out = []
    pub_ref = PUBLISHED["Transformer"]
    for model, published in PUBLISHED.items():
        backend = OURS[model]
        pub_gap = published - pub_ref
        pub_text = f"{published:.2f} ({pub_gap:+.2f}: {point_class(pub_gap, LEVEL_BAND)})"
        claim = f"{model}: accuracy, gap to the Transformer"
        mine = accs.get(backend)
        if not mine or not reference:
            out.append(line(claim, backend, pub_text, NOT_MEASURED, rule="-"))
            continue
        if backend == REFERENCE:
            interval = interval_text(reference)
            out.append(line(claim, backend, pub_text, REFERENCE_VERDICT, interval=interval))
            continue
        if floor is None:
            out.append(
                line(
                    claim,
                    backend,
                    pub_text,
                    NO_FLOOR,
                    interval=gap_text(mine, reference, FEW_SEEDS),
                )
            )
            continue
        judged = judge_gap(reference, mine, floor=floor, band=LEVEL_BAND)
        verdict = judged.reason or (
            HOLDS if judged.cls == point_class(pub_gap, LEVEL_BAND) else FAILS
        )
        interval = "-" if judged.gap is None else judged.gap.text(sign=True)
        if judged.cls:
            interval += f" ({judged.cls})"
        out.append(line(claim, backend, pub_text, verdict, interval=interval))
    measured = {b: seeds for b, seeds in accs.items() if seeds}
    for extra in extra_backends(measured, REFERENCE, OURS.values(), "LRA", FEW_SEEDS):
        out.append(
            line(extra.claim, extra.backend, "-", extra.verdict, interval=extra.interval, rule="-")
        )
    return out
