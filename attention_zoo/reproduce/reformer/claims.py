"""The Reformer's claims: its published figures (published.py) beside our stored measurements,
each compared as a ratio of the same kind on both sides (so absolute sizes, their 11 GB GPU and
full-size models against our CPU scale, do not matter), with a verdict from a stated rule.

`claims(rows)` reads the rows `zoo reproduce reformer` stored (cases labelled
`reformer/<size>/<claim>/<role>`, task rows of `zoo task duplication`) and returns one row per claim
and size; a claim without rows says which command measures it.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...measure.metrics import is_measured
from ...report.claims import FAILS, HOLDS, NOT_MEASURED, WEAKER, ClaimRow
from ...tasks.base import tabulation_of
from ...tasks.results import TRAINED
from ...tasks.suite import TaskPreset
from ..stored import StoredCase, stored_cases, task_cases
from .experiments import PREFIX, SIZES
from .published import PUBLISHED, TRAINED_AS, table2

TASK = "duplication"  # Table 2's task
SIZE_ORDER = tuple(reversed(SIZES))  # the most faithful size first
GB = 10**9  # the blog's "8GB" read as 8 * 10^9 bytes (the stricter reading)
MIB = 2**20

# ---- verdict rules ------------------------------------------------------------------------------

SAVING_FACTOR = 1.25  # a saving "holds" if ours is at most this factor above the published ratio
NO_EFFECT_BAND = 0.10  # "no gain": the ratio within 1 +- this
MATCH_FLOOR, MATCH_WEAKER = 0.98, 0.90  # "matches": ratio at least this (holds / holds weaker)
MONOTONE_SLACK = 0.01  # accuracy may dip by one point between more and fewer hashes


@dataclass(frozen=True)
class Rule:
    """How a claim's ratio is judged: the text printed beside it and the function applying it."""

    text: str
    judge: Callable[[float, float], str]  # (ours, published) -> verdict


def _saving(ours: float, published: float) -> str:
    if ours <= published * SAVING_FACTOR:
        return HOLDS
    return WEAKER if ours < 1 else FAILS


def _no_effect(ours: float, published: float) -> str:
    return HOLDS if abs(ours - 1) <= NO_EFFECT_BAND else FAILS


def _match(ours: float, published: float) -> str:
    if ours >= MATCH_FLOOR:
        return HOLDS
    return WEAKER if ours >= MATCH_WEAKER else FAILS


def _exact(ours: float, published: float) -> str:
    if ours == published:
        return HOLDS
    return WEAKER if abs(ours / published - 1) <= 0.05 else FAILS


def _fits(ours: float, published: float) -> str:
    # ours: 2 = fits in float32, 1 = fits only in bfloat16, 0 = fits in neither
    return {2: HOLDS, 1: WEAKER}.get(int(ours), FAILS)


def _monotone(ours: float, published: float) -> str:
    # ours: 2 = every row non-decreasing in eval hashes, 1 = only most hashes > one hash, 0 = else
    return {2: HOLDS, 1: WEAKER}.get(int(ours), FAILS)


RULES: dict[str, Rule] = {
    "saving": Rule(
        f"ratio < 1 is the claimed saving. holds: ours <= {SAVING_FACTOR} x published; "
        "holds weaker: ours < 1 (a smaller saving); does not hold: ours >= 1",
        _saving,
    ),
    "no effect": Rule(
        f"holds: |ours - 1| <= {NO_EFFECT_BAND} (no gain and no loss); does not hold otherwise",
        _no_effect,
    ),
    "match": Rule(
        f"holds: ours >= {MATCH_FLOOR}; holds weaker: ours >= {MATCH_WEAKER}; "
        "does not hold otherwise",
        _match,
    ),
    "exact": Rule(
        "holds: our counts equal the published ones; holds weaker: the ratio within 5%; "
        "does not hold otherwise",
        _exact,
    ),
    "fits": Rule(
        "holds: the float32 step fits the budget; holds weaker: only the bfloat16 step fits; "
        "does not hold: neither fits",
        _fits,
    ),
    "monotone": Rule(
        f"holds: every row's accuracy rises (or dips < {100 * MONOTONE_SLACK:.0f} point) with "
        "each doubling of eval hashes; holds weaker: only most hashes beat one hash in every row; "
        "does not hold otherwise",
        _monotone,
    ),
}


def verdict(rule: str, ours: float | None, published: float) -> str:
    """The verdict of `rule` for our ratio against the published one ('not measured' if None)."""
    if not is_measured(ours):
        return NOT_MEASURED
    return RULES[rule].judge(ours, published)


# ---- stored cases by claim ---------------------------------------------------------------------


def _labelled(cases: Iterable[StoredCase], size: str, claim: str) -> dict[str, list[StoredCase]]:
    """Cases of one claim at one size, by role (`reformer/<size>/<claim>/<role>`)."""
    out: dict[str, list[StoredCase]] = {}
    for case in cases:
        parts = str(case.config.get("label", "")).split("/")
        if len(parts) == 4 and parts[:3] == [PREFIX, size, claim]:
            out.setdefault(parts[3], []).append(case)
    return out


def _by(cases: Iterable[StoredCase], field: str) -> dict[Any, StoredCase]:
    return {_field(c, field): c for c in cases}


def _field(case: StoredCase, field: str) -> Any:
    if field in case.config.get("model", {}):
        return case.config["model"][field]
    return case.config.get(field)


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value / MIB:,.0f} MiB"


# ---- the claims ---------------------------------------------------------------------------------


def _row(
    claim: str,
    setting: str,
    published: str,
    ours: str,
    rule: str,
    ours_value: float | None,
    published_value: float,
    used: tuple[str, ...] = (),
) -> ClaimRow:
    """One evaluated claim at one size: the verdict of `rule` on the two values."""
    return ClaimRow(
        claim=claim,
        setting=setting,
        published=published,
        ours=ours,
        rule=RULES[rule].text,
        verdict=verdict(rule, ours_value, published_value),
        rows_used=tuple(used),
    )


def _memory_claim(
    claim: str,
    setting: str,
    published_text: str,
    rule: str,
    published: float,
    num: Mapping[int, StoredCase],
    den: Mapping[int, StoredCase],
    more: str = "",
) -> ClaimRow:
    """A claim on the peak memory num / den at the longest length both have, judged by `rule`;
    `more` is added to ours where there is a ratio."""
    ratio, ours, used = _ratio_at_longest(num, den)
    if ratio is not None:
        ours += more
    return _row(claim, setting, published_text, ours, rule, ratio, published, used)


def _ratio_at_longest(
    num: Mapping[int, StoredCase], den: Mapping[int, StoredCase]
) -> tuple[float | None, str, tuple[str, ...]]:
    """num/den memory at the longest length where both have a number, as a ratio, the text
    showing it (length, measured or predicted, both sizes) and the refs of the two cases."""
    both = []
    for n in sorted(set(num) & set(den)):
        (a, how_a), (b, how_b) = num[n].memory(), den[n].memory()
        if a is not None and b:
            both.append((n, a, b, "measured" if how_a == how_b == "measured" else "predicted"))
    if not both:
        return None, "no length where both have a number", ()
    n, a, b, how = both[-1]
    text = f"{a / b:.2f} at L={n} ({how}: {_mib(a)} vs {_mib(b)})"
    return a / b, text, (num[n].ref, den[n].ref)


def _growth(cases: Mapping[int, StoredCase]) -> str:
    values = [(n, c.memory()[0]) for n, c in sorted(cases.items()) if c.memory()[0]]
    if len(values) < 2:
        return ""
    (n0, v0), (n1, v1) = values[0], values[-1]
    return f"x{v1 / v0:.1f} from L={n0} to {n1}"


def _claim_a(cases: list[StoredCase], size: str) -> list[ClaimRow]:
    roles = _labelled(cases, size, "a")
    if not roles:
        return []
    pub = PUBLISHED["a"]
    common = sorted(set(pub["global_mb"]) & set(pub["local_lsh_mb"]))
    n0, n_pub = common[0], common[-1]
    glob, lsh_mb = pub["global_mb"], pub["local_lsh_mb"]
    published = lsh_mb[n_pub] / glob[n_pub]
    pub_text = (
        f"{published:.2f} at n={n_pub} ({lsh_mb[n_pub]} vs {glob[n_pub]} MB); global "
        f"x{glob[n_pub] / glob[n0]:.1f}, local+LSH x{lsh_mb[n_pub] / lsh_mb[n0]:.1f} "
        f"from n={n0} to {n_pub}"
    )
    lsh = _by(roles.get("local+lsh", []), "seq_len")
    lines = []
    for other, claim in (
        ("full", "a. local+LSH attention needs less inference memory than global attention"),
        ("sdpa", "a. ... and than today's fused exact kernel (SDPA, not in the blog)"),
    ):
        ref = _by(roles.get(other, []), "seq_len")
        setting = f"{size}: ReformerLM inference, batch 1, peak memory local+lsh / {other}"
        growth = f"; {other} {_growth(ref)}, local+lsh {_growth(lsh)}"
        row = _memory_claim(claim, setting, pub_text, "saving", published, lsh, ref, growth)
        lines.append(row)
    return lines


def _claim_b(cases: list[StoredCase], size: str) -> list[ClaimRow]:
    roles = _labelled(cases, size, "b")
    if not roles:
        return []
    lines = []
    for config, claim, rule in (
        ("default", "b. chunked feed-forward: no gain at the default config", "no effect"),
        ("wide", "b. chunked feed-forward: a clear gain with d_ff 16384 and 2 heads", "saving"),
    ):
        table = PUBLISHED[f"b_{config}"]["mb"]
        n_pub = max(table)
        published = table[n_pub][1] / table[n_pub][0]
        chunked = _by(roles.get(f"{config}-chunked", []), "seq_len")
        plain = _by(roles.get(f"{config}-unchunked", []), "seq_len")
        setting = f"{size}: ReformerLM inference, peak memory chunked / unchunked FFN"
        pub_text = f"{published:.2f} at n={n_pub} ({table[n_pub][1]} vs {table[n_pub][0]} MB)"
        lines.append(_memory_claim(claim, setting, pub_text, rule, published, chunked, plain))
    return lines


def _slope(points: list[tuple[float, float]]) -> float | None:
    if len(points) < 2:
        return None
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    den = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / den if den else None


def _claim_c(cases: list[StoredCase], size: str) -> list[ClaimRow]:
    roles = _labelled(cases, size, "c")
    if not roles:
        return []
    pub = PUBLISHED["c"]
    per_layer_pub = {
        k: _slope([(float(n), float(v)) for n, v in pub[f"{k}_mb"].items()])
        for k in ("standard", "reversible")
    }
    published = per_layer_pub["reversible"] / per_layer_pub["standard"]
    slopes, used, hows = {}, [], set()
    for role in ("standard", "reversible"):
        points = []
        for case in roles.get(role, []):
            value, how = case.memory()
            if value is not None:
                points.append((float(_field(case, "num_hidden_layers")), value))
                used.append(case.ref)
                hows.add(how)
        slopes[role] = _slope(sorted(points))
    ratio = None
    if slopes["standard"] and slopes["reversible"] is not None:
        ratio = slopes["reversible"] / slopes["standard"]
    ours = (
        f"{ratio:.2f} ({'/'.join(sorted(hows))}: {_mib(slopes['reversible'])} vs "
        f"{_mib(slopes['standard'])} per layer)"
        if ratio is not None
        else "fewer than two layer counts with a number"
    )
    return [
        _row(
            "c. reversible residuals: far less training memory per added layer",
            f"{size}: ReformerLM forward+backward, peak memory growth per layer, "
            "reversible / standard (same model otherwise)",
            f"{published:.2f} ({per_layer_pub['reversible']:.0f} vs "
            f"{per_layer_pub['standard']:.0f} MB per layer)",
            ours,
            "saving",
            ratio,
            published,
            tuple(used),
        )
    ]


def _claim_d(cases: list[StoredCase], size: str) -> list[ClaimRow]:
    roles = _labelled(cases, size, "d")
    if not roles:
        return []
    pub = PUBLISHED["d"]
    lines = []
    params = {
        role: next((c for c in roles.get(f"{role}-parameters", [])), None)
        for role in ("axial", "standard")
    }
    if params["axial"] and params["standard"]:
        a, s = (params[r].metrics.get("parameters") for r in ("axial", "standard"))
        exact = a == pub["axial_parameters"] and s == pub["standard_parameters"]
        ratio = (s / a) if a and s else None
        published_ratio = pub["standard_parameters"] / pub["axial_parameters"]
        lines.append(
            _row(
                "d. axial position embeddings: 2,584,064 vs 136,572,416 parameters",
                f"{size}: crime-and-punishment ReformerModel built on the meta device",
                f"{pub['axial_parameters']:,} vs {pub['standard_parameters']:,} "
                f"(x{published_ratio:.1f})",
                f"{a:,.0f} vs {s:,.0f} (x{ratio:.1f})" if ratio else "not counted",
                "exact",
                published_ratio if exact else ratio,
                published_ratio,
                (params["axial"].ref, params["standard"].ref),
            )
        )
    axial = _by(roles.get("axial", []), "seq_len")
    standard = _by(roles.get("standard", []), "seq_len")
    if axial or standard:
        published = pub["axial_mb"] / pub["standard_mb"]
        claim = "d. axial position embeddings: the memory saving"
        setting = f"{size}: crime-and-punishment ReformerLM inference, peak memory axial / standard"
        pub_text = (
            f"{published:.2f} at batch 8, n 512 ({pub['axial_mb']} vs {pub['standard_mb']} MB)"
        )
        lines.append(_memory_claim(claim, setting, pub_text, "saving", published, axial, standard))
    return lines


def _claim_e(cases: list[StoredCase], size: str) -> list[ClaimRow]:
    roles = _labelled(cases, size, "e")
    if not roles:
        return []
    pub = PUBLISHED["e"]
    budget = pub["budget_gb"] * GB
    step = {_field(c, "dtype"): c for c in roles.get("train-step", [])}
    totals = {dtype: step[dtype].memory() for dtype in ("float32", "bfloat16") if dtype in step}
    fits = {d: v is not None and v <= budget for d, (v, _) in totals.items()}
    score = None
    if totals and all(v is not None for v, _ in totals.values()):
        score = 2.0 if fits.get("float32") else 1.0 if fits.get("bfloat16") else 0.0
    tokens = {_field(c, "seq_len") for c in step.values()}
    ours = ", ".join(
        f"{d} {v / GB:.2f} GB ({how})" if v is not None else f"{d} {how}"
        for d, (v, how) in totals.items()
    )
    return [
        _row(
            "e. a 0.5M-token training step fits in 8 GB",
            f"{size}: crime-and-punishment ReformerLM train step at L="
            f"{', '.join(map(str, sorted(tokens)))} (blog: {pub['tokens']:,})",
            f"< {pub['budget_gb']} GB",
            ours or "no step with a number",
            "fits",
            score,
            2.0,
            tuple(c.ref for c in step.values()),
        )
    ]


# ---- Table 2 ------------------------------------------------------------------------------------


def _hashes(label: str) -> int | None:
    head, _, tail = label.rpartition("-")
    return int(tail) if head == "lsh" and tail.isdigit() else None


def monotone_score(matrix: Mapping[str, Mapping[str, float]]) -> float | None:
    """2: every row's accuracy is non-decreasing as eval hashes double (within the slack); 1: only
    the most hashes beat one hash in every row; 0: neither; None: no row with two eval hashes."""
    rows = []
    for evals in matrix.values():
        seq = [evals[e] for e in sorted(evals, key=lambda e: _hashes(e) or 0) if _hashes(e)]
        if len(seq) >= 2:
            rows.append(seq)
    if not rows:
        return None
    if all(b >= a - MONOTONE_SLACK for seq in rows for a, b in itertools.pairwise(seq)):
        return 2.0
    return 1.0 if all(seq[-1] > seq[0] for seq in rows) else 0.0


FULL_ROW = TRAINED_AS["full"]  # the full-attention-trained model: shared-QK, as in the paper
FULL_COLUMN = "full"  # evaluated with (shared-QK) full attention


def diagonal_ratio(matrix: Mapping[str, Mapping[str, float]]) -> float | None:
    """Accuracy of the LSH-trained model with the most hashes, evaluated as trained, over the
    full-trained model's accuracy with full attention."""
    lsh = [r for r in matrix if _hashes(r)]
    full = matrix.get(FULL_ROW, {}).get(FULL_COLUMN)
    if full is None or not lsh:
        return None
    best = max(lsh, key=_hashes)
    own = matrix[best].get(best)
    return own / full if own is not None and full else None


def _task_matrices(
    rows: Any, presets: Sequence[TaskPreset]
) -> dict[tuple[str, int], tuple[dict, tuple[str, ...]]]:
    """(preset, length) -> ({train: {eval: accuracy}}, refs) from stored duplication task rows,
    tabulated as the task declares: rows the shared-QK model (the paper's full attention) and the
    LSH-trained ones; "as trained" accuracy fills the diagonal."""
    tabulation = tabulation_of(TASK)
    out: dict[tuple[str, int], tuple[dict, list[str]]] = {}
    for case in task_cases(rows, TASK, presets):
        cfg = case.config
        train = cfg["backend"]
        if train != FULL_ROW and not _hashes(train):
            continue
        matrix, refs = out.setdefault((cfg["preset"], int(cfg["length"])), ({}, []))
        # "as trained" last: it wins over an evaluation override naming the training attention
        for name in sorted(case.metrics, key=lambda m: "@" not in m):
            if (cell := tabulation.place(train, name)) is None:
                continue
            evaluation = cell[1]
            if evaluation == TRAINED:
                evaluation = FULL_COLUMN if train == FULL_ROW else train
            matrix.setdefault(train, {})[evaluation] = case.metrics[name]
        refs.append(case.ref)
    return {k: (m, tuple(r)) for k, (m, r) in out.items()}


def _claim_f(rows: Any, presets: Sequence[TaskPreset]) -> list[ClaimRow]:
    pub = table2()
    lines = []
    for (preset, length), (matrix, refs) in sorted(_task_matrices(rows, presets).items()):
        setting = f"duplication task, preset {preset}, L={length}"
        mono = monotone_score(matrix)
        lines.append(
            _row(
                "f. more evaluation hashes give higher accuracy",
                setting + f" ({len(matrix)} trained model(s))",
                "every row rises with eval hashes",
                {2.0: "every row rises", 1.0: "most > one hash only", 0.0: "not in every row"}.get(
                    mono, "no row with two eval hashes"
                ),
                "monotone",
                mono,
                monotone_score(pub) or 0.0,
                refs,
            )
        )
        diag = diagonal_ratio(matrix)
        published = diagonal_ratio(pub) or 0.0
        lines.append(
            _row(
                "f. LSH-trained models match full-trained ones on the diagonal",
                setting,
                f"{published:.3f} (LSH-4 as trained / full with full)",
                f"{diag:.3f}" if diag is not None else "needs an LSH-trained and a full row",
                "match",
                diag,
                published,
                refs,
            )
        )
    return lines


# ---- the table ----------------------------------------------------------------------------------

MEASURED_BY = {
    "a": "zoo reproduce reformer",
    "b": "zoo reproduce reformer",
    "c": "zoo reproduce reformer",
    "d": "zoo reproduce reformer",
    "e": "zoo reproduce reformer",
    "f": "zoo reproduce reformer --with-table2 (or: zoo task duplication --preset cpu --table2)",
}
CLAIM_TITLES = {
    "a": "a. local+LSH attention needs less inference memory than global attention",
    "b": "b. chunked feed-forward: no gain at the default config, a gain with a wide FFN",
    "c": "c. reversible residuals: far less training memory per added layer",
    "d": "d. axial position embeddings: fewer parameters and less memory",
    "e": "e. a 0.5M-token training step fits in 8 GB",
    "f": "f. Table 2: more eval hashes help; LSH-trained matches full on the diagonal",
}


def claims(rows: Any, presets: Sequence[TaskPreset] = ()) -> list[ClaimRow]:
    """One row per claim and size from stored rows (a `ResultStore.to_dataframe()` frame); a
    claim with no rows is NOT_MEASURED with the command that measures it. Claim f reads the
    duplication runs of `presets` only as each is defined now."""
    cases = stored_cases(rows)
    found: dict[str, list[ClaimRow]] = {claim: [] for claim in CLAIM_TITLES}
    for size in SIZE_ORDER:
        for claim, fn in (
            ("a", _claim_a),
            ("b", _claim_b),
            ("c", _claim_c),
            ("d", _claim_d),
            ("e", _claim_e),
        ):
            found[claim] += fn(cases, size)
    found["f"] = _claim_f(rows, presets)
    out = []
    for claim, lines in found.items():
        out += lines or [
            ClaimRow(
                claim=CLAIM_TITLES[claim],
                setting="-",
                published="see " + PUBLISHED[claim if claim != "b" else "b_wide"]["source"],
                ours=f"run: {MEASURED_BY[claim]}",
                rule="-",
                verdict=NOT_MEASURED,
            )
        ]
    return out


__all__ = [
    "CLAIM_TITLES",
    "RULES",
    "StoredCase",
    "claims",
    "diagonal_ratio",
    "monotone_score",
    "stored_cases",
    "verdict",
]
