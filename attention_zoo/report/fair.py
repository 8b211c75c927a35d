"""Fair comparison section: what each variant holds that a comparison may want equal (one block's
parameters, one sequence's decoding state, forward FLOPs per token), computed for the setting it
was measured at and stored with its rows, beside its time; variants at equal state or equal
parameters with the reference are named."""

from __future__ import annotations

from typing import Any

from ..errors import UsageError
from ..measure.status import OK
from .context import TIME, Context, empty_section
from .cost import computes, header, ratio_cell, reference_row, settings
from .document import Heading, Para, Table

TITLE = "Fair comparison"
COMMAND = "zoo bench --metrics time,predict,flops"
FAIR = ("block_parameters", "state_bytes_per_sequence", "flops_per_token")
EQUAL_WITHIN = 0.10  # "equal" state or parameters: within 10% of the reference's


def section(ctx: Context) -> list[Any]:
    if ctx.bench.empty:
        return empty_section(TITLE, COMMAND)
    blocks: list[Any] = []
    for setting, part in settings(ctx):
        ok = part[(part["status"] == OK) & part["metrics"].map(_has_fair)]
        if ok.empty:
            continue
        n = ok["seq_len"].max()
        at_n = ok[ok["seq_len"] == n]
        rows = []
        for _, row in at_n.sort_values("variant").iterrows():
            ref = reference_row(part, n, ctx.reference, row["backend"])
            rows.append(
                [
                    f"`{row['variant']}`",
                    computes(row),
                    *(ctx.metric(row, m) for m in FAIR),
                    ratio_cell(ctx, row, ref, TIME),
                ]
            )
        blocks += [
            Para(f"`{setting}` at L = {n}. {_equal_text(ctx, at_n)}"),
            Table(
                [
                    "variant",
                    "computes",
                    *(header(m, _SHORT[m]) for m in FAIR),
                    f"time x {ctx.reference}",
                ],
                rows,
            ),
        ]
    if not blocks:
        return empty_section(TITLE, COMMAND)
    intro = Para(
        "What a comparison may hold equal, computed (not measured) at each case's own setting: "
        "one attention block's parameters, the decoding state of one sequence at the case's "
        "context (none: the variant cannot decode), and one block's forward FLOPs per position. "
        f"Variants within {EQUAL_WITHIN:.0%} of `{ctx.reference}`'s state or parameters are "
        "named under each table."
    )
    return [Heading(1, TITLE), intro, *blocks]


_SHORT = {
    "block_parameters": "params / block",
    "state_bytes_per_sequence": "state / sequence",
    "flops_per_token": "FLOPs / token",
}


EQUAL = {"state": "state_bytes_per_sequence", "params": "block_parameters"}  # zoo report --equal


def hold_equal(bench: Any, reference: str, what: str) -> Any:
    """The bench cases of variants within EQUAL_WITHIN of the reference's `what` (a key of EQUAL)
    at the same setting and length, the reference's own included; a length without a reference
    case keeps nothing (there is nothing to be equal to)."""
    if bench.empty:
        return bench
    metric = EQUAL[what]

    def kept(row: Any) -> bool:
        part = bench[(bench["setting"] == row["setting"]) & (bench["seq_len"] == row["seq_len"])]
        refs = part[part["variant"] == reference]
        want = refs.iloc[0]["metrics"].get(metric) if not refs.empty else None
        got = row["metrics"].get(metric)
        return want is not None and got is not None and abs(got - want) <= EQUAL_WITHIN * want

    return bench[[kept(row) for _, row in bench.iterrows()]]


def held_equal_text(before: Any, after: Any, reference: str, what: str) -> str:
    """What --equal kept, for the summary; UsageError where it kept nothing (a report of no
    case would read as an empty store)."""
    metric = EQUAL[what]
    lacking = sum(metric not in m for m in before["metrics"]) if len(before) else 0
    rule = f"{what} within {EQUAL_WITHIN:.0%} of `{reference}`'s at the same setting and length"
    if len(before) and after.empty:
        raise UsageError(
            f"--equal {what} keeps none of the {len(before)} cases ({lacking} lack "
            f"{metric}: measure with --metrics predict; the others are not within "
            f"{EQUAL_WITHIN:.0%} of {reference}'s or have no {reference} case); drop --equal"
        )
    return (
        f"Held equal (`--equal {what}`): the cases with {rule}, {len(after)} of {len(before)} "
        f"({lacking} lack the number)."
    )


def _has_fair(metrics: dict[str, Any]) -> bool:
    return any(m in metrics for m in FAIR)


def _equal_text(ctx: Context, at_n: Any) -> str:
    """Which variants hold the reference's state and parameters (within EQUAL_WITHIN)."""
    ref = at_n[at_n["variant"] == ctx.reference]
    if ref.empty:
        return f"No `{ctx.reference}` case here to hold equal."
    parts = []
    for metric, what in (("state_bytes_per_sequence", "state"), ("block_parameters", "parameters")):
        want = ref.iloc[0]["metrics"].get(metric)
        if not want:
            continue
        equal = [
            f"`{r['variant']}`"
            for _, r in at_n.iterrows()
            if r["variant"] != ctx.reference
            and (got := r["metrics"].get(metric)) is not None
            and abs(got - want) <= EQUAL_WITHIN * want
        ]
        parts.append(f"At `{ctx.reference}`'s {what}: {', '.join(equal) or 'none'}.")
    return " ".join(parts)
