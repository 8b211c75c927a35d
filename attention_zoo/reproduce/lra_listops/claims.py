"""LRA ListOps (Tay et al. 2021, Table 1): every bidirectional backend trained on the listops task,
beside LRA's published accuracies.

At CPU scale the sequences, model and budget are far smaller than LRA's, so cells are not
compared: each mechanism's gap to full attention is, classed as level with it or below it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ...report.claims import FAILS, HOLDS, NOT_MEASURED, ClaimRow

TASK = "listops"
REFERENCE = "full"
REFERENCE_VERDICT, OURS_ONLY = "reference", "ours only"  # rows without a verdict of their own
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
}
# LRA's model -> the backend (training-variant label) that implements its mechanism here
OURS = {
    "Transformer": REFERENCE,
    "Local Attention": "local",
    "Reformer": "lsh-2",
    "Performer": "performer",
    "Linformer": "linformer",
    "BigBird": "bigbird",
    "Longformer": "sliding-window",
}
LEVEL_BAND = 3.0  # points: a gap to full attention within +-3 is "level", below -3 is "below"


def accuracies(rows: Iterable[Mapping[str, Any]], preset: str) -> dict[str, float]:
    """Backend -> final accuracy [%] (mean over seeds) of the stored listops runs of `preset`."""
    values: dict[str, list[float]] = {}
    for r in rows:
        if r["task"] != TASK or r["preset"] != preset or r["value"] is None:
            continue
        if r["metric"] == "accuracy" and r["eval"] == "trained":
            values.setdefault(r["backend"], []).append(100 * float(r["value"]))
    return {b: sum(v) / len(v) for b, v in values.items()}


def refs(rows: Iterable[Mapping[str, Any]], preset: str, backend: str) -> tuple[str, ...]:
    """The stored cases ("run/case") a backend's accuracy was read from."""
    return tuple(
        r["ref"]
        for r in rows
        if r["task"] == TASK and r["preset"] == preset and r["backend"] == backend
        and r["metric"] == "accuracy" and r["eval"] == "trained" and r.get("ref")
    )  # fmt: skip


def level(gap: float) -> str:
    return "level" if abs(gap) <= LEVEL_BAND else "below" if gap < 0 else "above"


def claims(rows: Iterable[Mapping[str, Any]], preset: str) -> list[ClaimRow]:
    """One line per LRA model: published accuracy and gap to the Transformer, ours beside them."""
    rows = list(rows)
    ours = accuracies(rows, preset)
    reference = ours.get(REFERENCE)
    rule = (
        f"gap to full attention classed level (within +-{LEVEL_BAND:g} points), below or above; "
        "holds when our class is LRA's"
    )
    out = []
    for model, published in PUBLISHED.items():
        backend = OURS[model]
        pub_gap = published - PUBLISHED["Transformer"]
        mine = ours.get(backend)
        if mine is None or reference is None:
            text, verdict = "-", NOT_MEASURED
        else:
            gap = mine - reference
            text = f"{mine:.1f} ({gap:+.1f})"
            if backend == REFERENCE:
                verdict = REFERENCE_VERDICT
            else:
                verdict = HOLDS if level(gap) == level(pub_gap) else FAILS
        out.append(
            ClaimRow(
                claim=f"{model}: accuracy (gap to the Transformer)",
                setting=f"listops, preset {preset}, backend {backend}",
                published=f"{published:.2f} ({pub_gap:+.2f})",
                ours=text,
                rule=rule,
                verdict=verdict,
                rows_used=refs(rows, preset, backend) + refs(rows, preset, REFERENCE)
                if backend != REFERENCE
                else refs(rows, preset, REFERENCE),
            )
        )
    for backend in sorted(set(ours) - set(OURS.values())):
        gap = "" if reference is None else f" ({ours[backend] - reference:+.1f})"
        out.append(
            ClaimRow(
                claim="accuracy (gap to full attention); no LRA row",
                setting=f"listops, preset {preset}, backend {backend}",
                published="-",
                ours=f"{ours[backend]:.1f}{gap}",
                rule="-",
                verdict=OURS_ONLY,
                rows_used=refs(rows, preset, backend),
            )
        )
    return out
