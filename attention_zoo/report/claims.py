"""The Claims section: each reproduction's claims (published figure, ours, rule, verdict) as the
reproduction words them. The report names no paper: the reproductions are handed to it.

A reproduction (attention_zoo.reproduce) is anything with the `ClaimsSource` shape: a name, a
title, the command that measures it, `claims(rows) -> list[ClaimRow]` from stored rows, and
`report_sections(ctx)` for tables of its own (e.g. a paper's table beside ours), and `plots`, the
file patterns of the plots those write (a rebuilt report drops the old ones it did not write).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .context import Context
from .document import Heading, Para, Table
from .ledger import numbers_in

CLAIM_COLUMNS = (
    "claim", "setting", "scale", "published", "ours", "interval", "floor", "seeds", "ratio_rule",
    "verdict", "rows used",
)  # fmt: skip
# The report's claims tables: these columns, less those "-" on every row. A table's verdict rule
# is stated once above it (one table per rule); scale, floor and seeds too when one value holds
# for every row, else in each row's setting. Each number's rows: numbers.json, not a column.
SHOWN = ("claim", "setting", "published", "ours", "interval", "verdict")
CONTEXT = ("scale", "floor", "seeds")
HOLDS, WEAKER, FAILS, NOT_MEASURED = "holds", "holds weaker", "does not hold here", "not measured"
# No verdict although measured: "undecided: <why>" (the run cannot tell; counted as undecided).
UNDECIDED = "undecided"


@dataclass(frozen=True, kw_only=True)
class ClaimRow:
    """One claim at one setting: the published figure and ours as the same kind of number, the
    rule that judges them, the verdict, and the stored cases (`run/case`) it read."""

    claim: str
    setting: str
    published: str
    ours: str
    rule: str  # the verdict rule in words ("-" when not measured)
    verdict: str  # HOLDS, WEAKER, FAILS, NOT_MEASURED or "undecided: <why>"
    rows_used: tuple[str, ...] = ()
    scale: str = "-"  # the size the claim was measured at (lengths, model, steps)
    interval: str = "-"  # the confidence interval the verdict read (e.g. of a gap over seeds)
    floor: str = "-"  # what the reference had to clear for a verdict, and whether it did
    seeds: str = "-"  # the seeds read

    def cells(self) -> list[str]:
        """The row in CLAIM_COLUMNS order."""
        return [
            self.claim,
            self.setting,
            self.scale,
            self.published,
            self.ours,
            self.interval,
            self.floor,
            self.seeds,
            self.rule,
            self.verdict,
            " ".join(self.rows_used),
        ]


def verdict_class(verdict: str) -> str:
    """What the summary counts a verdict as: "undecided: <why>" as UNDECIDED, others as is."""
    return verdict.split(":", 1)[0] if verdict.startswith(UNDECIDED) else verdict


class ClaimsSource(Protocol):
    """What the report needs of a reproduction."""

    name: str
    title: str  # the heading of its claims, e.g. "<paper>'s claims"
    plots: tuple[str, ...]  # glob patterns of the plot files its report sections write

    @property
    def command(self) -> str: ...  # the command that measures it

    def claims(self, rows: Any) -> list[ClaimRow]: ...

    def report_sections(self, ctx: Context) -> list[Any]: ...


def claims_section(ctx: Context, rows: Any, sources: Sequence[ClaimsSource]) -> list[Any]:
    """Heading 'Claims', then each reproduction with a measured claim as its table (numbers
    recorded with the rows they used); the others named with the command that measures them."""
    blocks: list[Any] = [Heading(1, "Claims")]
    waiting = []
    for source in sources:
        claims = source.claims(rows)
        if not any(c.verdict != NOT_MEASURED for c in claims):
            waiting.append(f"`{source.name}` ({source.title}: run `{source.command}`)")
            continue
        blocks.append(Heading(2, source.title))
        for rule, group in _by_rule(claims):
            blocks += _table(ctx, rule, group)
    if len(blocks) > 1:
        blocks.append(
            Para(
                "Each number's stored rows are named in `numbers.json` (source `claims`), the rows "
                "themselves in `rows.csv`."
            )
        )
    if not sources:
        blocks.append(Para("No reproduction is registered; `zoo reproduce --list` lists them."))
    elif waiting:
        blocks.append(Para("No rows for any claim yet: " + "; ".join(waiting) + "."))
    return blocks


def claim_verdicts(rows: Any, sources: Sequence[ClaimsSource]) -> list[tuple[str, str]]:
    """(verdict class, rows used) of every claim of every reproduction, e.g. to count them."""
    return [
        (verdict_class(c.verdict), " ".join(c.rows_used)) for s in sources for c in s.claims(rows)
    ]


def _by_rule(claims: Sequence[ClaimRow]) -> list[tuple[str, list[ClaimRow]]]:
    """The claims grouped by verdict rule, in order of first appearance. A measured claim without
    a rule ("-": ours only) stays with the claim before it; unmeasured ones form a group of
    their own."""
    groups: dict[str, list[ClaimRow]] = {}
    last = "-"
    for claim in claims:
        if claim.rule != "-":
            last = claim.rule
        key = "-" if claim.verdict == NOT_MEASURED and claim.rule == "-" else last
        groups.setdefault(key, []).append(claim)
    return list(groups.items())


def _table(ctx: Context, rule: str, claims: Sequence[ClaimRow]) -> list[Any]:
    """One rule's claims: the rule and what every row shares, then the table of what differs."""
    rows = [dict(zip(CLAIM_COLUMNS, c.cells())) for c in claims]
    for claim, row in zip(claims, rows):
        for column, text in row.items():
            if column != "rows used" and numbers_in(text):
                ctx.ledger.claims(text, " ".join(claim.rows_used))
    shared = [f"**Verdict rule**: {rule}."] if rule != "-" else []
    for column in CONTEXT:
        values = {row[column] for row in rows}
        if len(values) == 1:
            if (value := values.pop()) != "-":
                shared.append(f"**{column.capitalize()}**: {value}.")
            continue
        for row in rows:
            if row[column] != "-":
                row["setting"] += f"; {column} {row[column]}"
    columns = [c for c in SHOWN if any(row[c] != "-" for row in rows) or c == "verdict"]
    table = Table(list(columns), [[row[c] for c in columns] for row in rows])
    return [Para(" ".join(shared)), table] if shared else [table]


__all__ = [
    "CLAIM_COLUMNS",
    "FAILS",
    "HOLDS",
    "NOT_MEASURED",
    "UNDECIDED",
    "WEAKER",
    "ClaimRow",
    "ClaimsSource",
    "claim_verdicts",
    "claims_section",
    "verdict_class",
]
