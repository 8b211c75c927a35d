"""The report's first section, made from the numbers: per setting and length the fastest and the
leanest exact and not-exact variant (ratio to the reference, approx_error for the not exact), the
crossovers between them, the claims' verdicts and what was set aside, counted. summary.md holds it
alone (a pull-request comment)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from ..measure.labels import APPROX_CLASS, EXACT_CLASS, UNKNOWN_KIND, kind_class
from ..measure.metrics import approx_error_name
from ..measure.status import ERROR, INVALID, OK, OOM, SKIPPED, TIMEOUT
from ..store import run_status
from .claims import FAILS, HOLDS, NOT_MEASURED, UNDECIDED, WEAKER, ClaimsSource, claim_verdicts
from .context import TIME, Context, flag, trusted
from .cost import (
    MEMORY,
    NOT_ENOUGH,
    QUICK,
    best,
    crossover_text,
    has_reference,
    memory_of,
    named_value,
    ratio_cell,
    reference_row,
    series,
    set_aside_rows,
    settings,
    tie_text,
    tied,
)
from .decoding import cheapest
from .document import Heading, Para, Table, anchor
from .frame import CPU_TIME

TITLE = "Summary"
SHOWN_ERROR = approx_error_name("peaked")  # sharp attention: where an approximation's error shows
# How the summary counts cases without numbers (status -> words).
SET_ASIDE = {
    OOM: "out of memory",
    SKIPPED: "unavailable here",
    ERROR: "failed",
    INVALID: "invalid",
    TIMEOUT: "over the time limit",
}
VERDICT_ORDER = (HOLDS, WEAKER, FAILS, UNDECIDED, NOT_MEASURED)
CLAIMS_SECTION, MISSING_SECTION = "Claims", "Cases without numbers"
CPU_TIME_RULE = (
    f"Settings named `{CPU_TIME}` were timed by the process's CPU time at one thread: other "
    "processes cannot inflate it by taking the core, so a busy machine still ranks them."
)


def summary(ctx: Context, rows: Any, reproductions: Sequence[ClaimsSource] = ()) -> list[Any]:
    """The Summary section's blocks (heading first); `reproductions`: whose claims to count."""
    blocks: list[Any] = [Heading(1, TITLE)]
    if text := _unfinished(ctx):
        blocks.append(Para(text))
    if ctx.held_equal:
        blocks.append(Para(ctx.held_equal))
    groups = settings(ctx)
    if groups:
        table, wins = _table(ctx, groups)
        blocks.append(Para(_scope(ctx, groups)))
        if wins:
            blocks.append(Para(_winners(ctx, wins)))
        if table.rows:
            blocks += [table, _crossovers(ctx, groups)]
        else:  # every case failed or was skipped
            blocks.append(
                Para(
                    "No case has numbers to rank: each says why in "
                    f"[{MISSING_SECTION}](#{anchor(MISSING_SECTION)})."
                )
            )
        if text := _reference_unbeaten(ctx, groups):
            blocks.append(Para(text))
        blocks += cheapest(ctx)  # generation: the cheapest token per context length
    else:
        blocks.append(Para(_holdings(ctx, rows, reproductions)))
    if text := _claims(ctx, rows, reproductions):
        blocks.append(Para(text))
    blocks.append(Para(_set_aside(ctx)))
    return blocks


def _holdings(ctx: Context, rows: Any, reproductions: Sequence[ClaimsSource]) -> str:
    """What a report without bench cases holds (task runs, claims), and how to add the rest."""
    held = []
    if not ctx.tasks.empty:
        tasks = ", ".join(f"`{t}`" for t in dict.fromkeys(ctx.tasks["task"]))
        held.append(f"training runs of {tasks} ([Task results](#{anchor('Task results')}))")
    measured = [
        f"`{r.name}`"
        for r in reproductions
        if any(c.verdict != NOT_MEASURED for c in r.claims(rows))
    ]
    if measured:
        held.append(f"the claims of {', '.join(measured)} ([Claims](#{anchor(CLAIMS_SECTION)}))")
    if not held:
        return f"Nothing is stored yet: run `{QUICK}` to fill this report."
    return (
        f"This report holds {' and '.join(held)}. It has no time or memory of an attention "
        f"variant: `{QUICK}` measures them."
    )


def _unfinished(ctx: Context) -> str:
    """A line for the runs whose cases this report shows that had not finished when it was
    built (still writing, killed, or interrupted): their numbers are a part of what was asked."""
    used = set(ctx.cases["run_id"]) if not ctx.cases.empty else set()
    # a run read back from an old report.md has no metadata: whether it finished is unknown
    late = [(r["run_id"], run_status(r)) for r in ctx.runs if r["run_id"] in used and r["meta"]]
    late = [(run, status) for run, status in late if status != "finished"]
    if not late:
        return ""
    runs = ", ".join(f"`{run}` ({status})" for run, status in late)
    return (
        f"**Not finished**: run{'s' if len(late) > 1 else ''} {runs} had not finished when this "
        "report was built (still running, stopped or killed), so it shows only the cases stored "
        "by then; build it again once the run ends (an interrupted run: the same `zoo bench` "
        "command with `--resume` first)."
    )


def short_settings(names: list[str]) -> dict[str, str]:
    """Each setting by the parameters that tell it apart from the others (all of it when alone)."""
    parts = {n: n.split(", ") for n in names}
    common = set.intersection(*(set(p) for p in parts.values())) if len(names) > 1 else set()
    return {n: ", ".join(x for x in p if x not in common) or n for n, p in parts.items()}


def _count(ctx: Context, inputs: list[Any]) -> str:
    return ctx.ledger.derive("count", "count", inputs)[1]


def _length_input(row: Any) -> Any:
    what = "config.seq_len" if "seq_len" in row["config"] else "config.length"
    return ([row["run_id"], row["case_key"], what], row["config"], row["config"].get(what[7:]))


def _scope(ctx: Context, groups: list[tuple[str, Any]]) -> str:
    bench = ctx.bench
    shortest = bench.loc[bench["seq_len"].idxmin()]
    longest = bench.loc[bench["seq_len"].idxmax()]
    firsts = [part.iloc[0] for _, part in groups]
    devices = ", ".join(sorted({f"`{d}`" for d in bench["device_name"]}))
    short, long = ctx.config(shortest, "seq_len"), ctx.config(longest, "seq_len")
    lengths = f"length {short}" if short == long else f"lengths {short} to {long}"
    settings_word = "setting" if len(groups) == 1 else "settings"
    return (
        f"{_count(ctx, [_length_input(r) for r in firsts])} {settings_word} on {devices}, "
        f"{lengths}. "
        f"{_reference_text(ctx, groups)} "
        f"**{EXACT_CLASS}**: equals full softmax attention; **{APPROX_CLASS}**: computes something "
        "else — softmax under a fixed pattern such as a local window, a recurrence over a "
        "constant-size state (marked recurrent), or an approximation shown with its approx_error "
        f"against full attention on peaked inputs (`{SHOWN_ERROR}`; zero: the same output). "
        "Times taken on a busy machine or with disagreeing repeats are never ranked, and no "
        "variant of their class is named fastest beside them."
        + (f" {CPU_TIME_RULE}" if (bench["clock"] == CPU_TIME).any() else "")
    )


def _reference_text(ctx: Context, groups: list[tuple[str, Any]]) -> str:
    """Which variant the ratios divide by, or that it was not measured (where it was not)."""
    ref = ctx.reference
    without = [part.iloc[0] for _, part in groups if not has_reference(part, ref)]
    if len(without) == len(groups):
        return (
            f"No `{ref}` case was measured, so no ratio is shown (`zoo report --reference` names "
            "the variant to divide by)."
        )
    text = (
        f"Every ratio divides by `{ref}` at the same setting and length (below one: better than "
        "it)."
    )
    if without:
        text = text[:-1] + (
            f"; {_count(ctx, [_length_input(r) for r in without])} settings have no `{ref}` "
            "case, so no ratios there."
        )
    return text


def _cell(ctx: Context, part: Any, at_n: Any, row: Any, metric: str, cls: str) -> str:
    if row is None:
        if aside := set_aside_rows(at_n, metric, cls):
            names = ", ".join(f"`{r['variant']}`" for r in aside)
            return f"not ranked: {names} set aside"
        present = any(kind_class(k) == cls for k in at_n["computes"])
        return "none ranked" if present else "none measured"
    ratio = ratio_cell(ctx, row, reference_row(part, row["seq_len"], ctx.reference, row["backend"]),
                       metric)  # fmt: skip
    text = f"`{row['variant']}` {ratio}" if ratio != "-" else named_value(ctx, row, metric)
    if row["computes"] == "recurrent":  # judged against its own recurrence, not full attention
        text += ", recurrent"
    elif row["computes"] != "full" and _has_error(part):
        error = ctx.metric(row, SHOWN_ERROR) if SHOWN_ERROR in row["metrics"] else "not measured"
        text += f", error {error}"
    return text


def _reference_unbeaten(ctx: Context, groups: list[tuple[str, Any]]) -> str:
    """The settings where the reference is faster than every not-exact variant at every length
    measured, said plainly (only where every such time there is ranked: none set aside)."""
    ref = ctx.reference
    found = []
    for setting, part in groups:
        ok = part[part["status"] == OK]
        lengths, beaten = [], set()
        for n, at_n in ok.groupby("seq_len", sort=True):
            mine = reference_row(part, n, ref)
            others = [r for _, r in at_n.iterrows() if r["computes"] not in ("full", UNKNOWN_KIND)]
            timed = [r for r in others if TIME in r["metrics"]]
            if mine is None or not trusted(mine, TIME) or not timed:
                break
            if not all(trusted(r, TIME) for r in timed):
                break
            if min(r["metrics"][TIME] for r in timed) <= mine["metrics"][TIME]:
                break
            lengths.append(at_n.iloc[0])
            beaten.update(r["variant"] for r in timed)
        else:
            if lengths:
                found.append((setting, lengths, sorted(beaten)))
    if not found:
        return ""
    names = short_settings([s for s, _ in groups])
    parts = [
        f"`{names[setting]}` (L {ctx.config(rows[0], 'seq_len')} to "
        f"{ctx.config(rows[-1], 'seq_len')}: {', '.join(f'`{v}`' for v in beaten)})"
        for setting, rows, beaten in found
    ]
    return (
        f"`{ref}` is faster than every not-exact variant measured at every measured length in "
        + ", ".join(parts)
        + ": at these lengths on this machine none of them saves time over it "
        "(measure longer lengths to find where one does)."
    )


def _has_error(part: Any) -> bool:
    """Whether any case of the setting has its approx_error (else the setting says so once)."""
    return any(SHOWN_ERROR in m for m in part["metrics"])


def _crossing(ctx: Context, ok: Any, metric: str) -> str:
    """Where the not-exact variant best at the longest length ranking both classes gets below
    the exact one best there."""
    for _, at_n in sorted(ok.groupby("seq_len"), key=lambda g: -g[0]):
        found = best(at_n, metric)
        a, b = found[APPROX_CLASS], found[EXACT_CLASS]
        if a is not None and b is not None:
            s = series(ok, metric)
            text = crossover_text(ctx, s[a["variant"]], s[b["variant"]], metric)
            return (
                f"`{a['variant']}` below `{b['variant']}`: {text}" if text != NOT_ENOUGH else text
            )
    return "no length ranks both classes"


def _table(ctx: Context, groups: list[tuple[str, Any]]) -> tuple[Table, dict[str, list[Any]]]:
    names = short_settings([s for s, _ in groups])
    rows = []
    wins: dict[str, list[Any]] = {}  # "fastest exact" -> [(winning row, metric)] per length
    for setting, part in groups:
        ok = part[part["status"] == OK]
        first = True
        for n, at_n in ok.groupby("seq_len", sort=True):
            name = _setting_cell(names[setting], part) if first else ""
            cells = [name, ctx.config(at_n.iloc[0], "seq_len")]
            for word, metric in (("fastest", TIME), ("leanest", memory_of(part))):
                found = best(at_n, metric)
                for cls in (EXACT_CLASS, APPROX_CLASS):
                    ties = tied(at_n, found[cls], metric)
                    cell = _cell(ctx, part, part[part["seq_len"] == n], found[cls], metric, cls)
                    cells.append(cell + tie_text(ties))
                    if found[cls] is not None and not ties:  # a tie is nobody's win
                        wins.setdefault(f"{word} {cls}", []).append((found[cls], metric))
            rows.append(cells)
            first = False
    by = _memory_words({memory_of(part) for _, part in groups})
    headers = [
        "setting",
        "L",
        f"fastest {EXACT_CLASS}",
        f"fastest {APPROX_CLASS}",
        f"leanest {EXACT_CLASS}{by}",
        f"leanest {APPROX_CLASS}{by}",
    ]
    divided = any(has_reference(part, ctx.reference) for _, part in groups)
    ratio = f"its ratio to `{ctx.reference}`" if divided else "its value (no ratios: see above)"
    caption = (
        "Per setting (the parameters that differ between settings) and length: the variant with "
        "the smallest median time and the smallest memory in each class (peak memory; a decode "
        f"setting's decoding state, what it keeps between tokens), with {ratio} "
        "(not ranked: the named variants' times were set aside, and any of "
        "them might be the fastest; none ranked: no variant of that class has a number there; "
        "none measured: no variant of that class at that length; tied: another variant's median "
        "time is within the larger of their interquartile ranges, or its memory is equal, so "
        "neither is counted a win)."
    )
    return Table(headers, rows, caption=caption), wins


def _setting_cell(name: str, part: Any) -> str:
    return f"`{name}`" + ("" if _has_error(part) else " (approx_error not measured)")


def _crossovers(ctx: Context, groups: list[tuple[str, Any]]) -> Table:
    """Per setting: where the best not-exact variant gets below the best exact one."""
    names = short_settings([s for s, _ in groups])
    rows = []
    for setting, part in groups:
        ok = part[part["status"] == OK]
        crossings = [_crossing(ctx, ok, metric) for metric in (TIME, memory_of(part))]
        rows.append([f"`{names[setting]}`", *crossings])
    by = _memory_words({memory_of(part) for _, part in groups})
    caption = (
        "Per setting: from which length the not-exact variant best at the longest length ranking "
        "both classes gets below the exact one best there, in time and in memory."
    )
    return Table(["setting", "time crossover", f"memory crossover{by}"], rows, caption=caption)


def _memory_words(metrics: set[str]) -> str:
    """What the leanest columns compare, as a header suffix: peak memory alone says nothing."""
    if metrics == {MEMORY}:
        return ""
    return " (state)" if MEMORY not in metrics else " (peak; decode: state)"


def _winners(ctx: Context, wins: dict[str, list[Any]]) -> str:
    sentences = []
    for cls in (EXACT_CLASS, APPROX_CLASS):
        parts = []
        for word in ("fastest", "leanest"):
            won = wins.get(f"{word} {cls}", [])
            if not won:
                continue
            counts = Counter(r["variant"] for r, _ in won)
            most = max(counts.values())
            tops = [v for v, n in counts.items() if n == most]  # equal counts: every one named
            of = _count(ctx, [ctx.input(r, m) for r, m in won])
            named = []
            for top in tops:
                mine = _count(ctx, [ctx.input(r, m) for r, m in won if r["variant"] == top])
                named.append(f"`{top}` (at {mine} of {of})")
            parts.append(f"{word} " + " and ".join(named))
        if parts:
            sentences.append(f"**{cls.capitalize()}**: " + ", ".join(parts))
    return (
        "Most often best, over every setting and length where its class has a ranked number "
        "and no tie: " + "; ".join(sentences) + "."
    )


def _claims(ctx: Context, rows: Any, reproductions: Sequence[ClaimsSource]) -> str:
    verdicts = claim_verdicts(rows, reproductions)
    if all(v == NOT_MEASURED for v, _ in verdicts):  # no reproduction's rows in the store
        return ""
    counts = Counter(v for v, _ in verdicts)
    # undecided is always counted (zero included): a claim the run could not decide is news
    order = [v for v in VERDICT_ORDER if v in counts or v == UNDECIDED]
    order += sorted(set(counts) - set(VERDICT_ORDER))
    used = {v: " ".join(u for w, u in verdicts if w == v) for v in order}
    parts = [f"{v}: {ctx.ledger.claims(str(counts[v]), used[v])}" for v in order]
    return (
        f"The reproductions' claims by verdict ([{CLAIMS_SECTION}](#{anchor(CLAIMS_SECTION)})): "
        + ", ".join(parts)
        + "."
    )


def _set_aside(ctx: Context) -> str:
    timed = [] if ctx.bench.empty else [
        r for _, r in ctx.bench.iterrows() if r["status"] == OK and TIME in r["metrics"]
    ]  # fmt: skip
    times = [
        f"{_count(ctx, [ctx.input(r, TIME) for r in rows])} {what}"
        for what, rows in (
            ("taken while the machine was busy", [r for r in timed if flag(r, "busy")]),
            # a time both busy and unstable is counted once, as busy
            ("unstable", [r for r in timed if flag(r, "unstable") and not flag(r, "busy")]),
        )
        if rows
    ]
    cases = [] if ctx.cases.empty else [r for _, r in ctx.cases.iterrows()]
    without = [
        f"{_count(ctx, [_length_input(r) for r in found])} {words}"
        for status, words in SET_ASIDE.items()
        if (found := [r for r in cases if r["status"] == status and _has_length(r)])
    ]
    if not times and not without:
        return "Nothing set aside: every case has its numbers and every time is ranked."
    text = "Set aside"
    if times:
        text += " — times (shown, never ranked, fitted or divided): " + ", ".join(times)
    if without:
        link = f"[{MISSING_SECTION}](#{anchor(MISSING_SECTION)})"
        text += f" — cases without numbers ({link}): " + ", ".join(without)
    return text + "."


def _has_length(row: Any) -> bool:
    return "seq_len" in row["config"] or "length" in row["config"]
