"""The targets scripts' output: one line a target with its verdict (PASS, FAIL or UNDECIDED),
and exit status 1 when a decided target failed."""

from __future__ import annotations


def report(verdicts: list[tuple[str, str]]) -> int:
    """Print each (target, verdict); 1 if any verdict is a FAIL, else 0."""
    for name, verdict in verdicts:
        print(f"- {name}: {verdict}")
    return 1 if any(v.startswith("FAIL") for _, v in verdicts) else 0
