"""Decoding section: what a generated token costs per backend, against the context it is generated
at: time per token and decoding-state bytes (log-log), the prompt's prefill time, fitted exponents,
and a backend's own decoding beside recomputing the prefix every token. `cheapest` is the
summary's part: per context length, the backend whose tokens cost least."""

from __future__ import annotations

from typing import Any

from ..attention.decode import DECODING_TEXT, RECOMPUTE, decoding_of
from ..attention.spec import BACKENDS
from ..measure.labels import APPROX_CLASS, EXACT_CLASS
from ..measure.status import OK
from .analysis import MIN_FIT_LENGTHS
from .context import TIME, Context, empty_section, opening, trusted
from .cost import (
    MEMORY,
    NOT_ENOUGH,
    best,
    computes,
    fit_inputs,
    header,
    named_value,
    note,
    tie_text,
    tied,
    variant_cell,
)
from .document import Heading, Image, Table
from .plots import scaling_plot

TITLE = "Decoding"
STATE = "state_bytes"
COMMAND = (
    "zoo bench --target attention --modes prefill,decode --lengths 1024,4096,16384 "
    "--new-tokens 64 --decoders own,recompute"
)
# the columns a decode case and its prompt's prefill case share (the mode aside)
SAME_PROMPT = ("target", "causal", "batch", "num_heads", "head_dim", "dtype", "device",
               "device_name", "threads", "variant", "seq_len")  # fmt: skip


def _mode(ctx: Context, mode: str) -> Any:
    bench = ctx.bench
    return bench.iloc[0:0] if bench.empty else bench[bench["mode"] == mode]


def decoding_text(row: Any) -> str:
    """How a case's variant decoded: recompute, or its backend's own decoding kind."""
    config = row["config"]
    if config.get("decoder") == RECOMPUTE:
        return DECODING_TEXT[RECOMPUTE]
    if row["backend"] not in BACKENDS:
        return "?"
    try:
        return DECODING_TEXT[decoding_of(BACKENDS.get(row["backend"]), **config.get("options", {}))]
    except Exception:  # options this version does not take
        return "?"


def section(ctx: Context) -> list[Any]:
    decoded = _mode(ctx, "decode")
    if decoded.empty:
        return empty_section(TITLE, COMMAND)
    blocks = opening(
        TITLE,
        (
            "What a generated token costs, per attention core (`zoo bench --modes "
            "prefill,decode`): the prompt of L tokens goes into the core's decoding state "
            "(**prefill**, timed apart), then tokens are decoded one at a time against it; "
            "**time per token** is the median over them, at contexts L to L + new_tokens. "
            "**state** is the decoding state's bytes per sequence (a KV cache grows with the "
            "context, a window or running sums do not; a KV cache is allocated for L + "
            "new_tokens positions at once). **decodes** says how: with its own state, or "
            "recomputing the whole prefix every token (a core without a state of its own, or "
            "`--decoders recompute` for comparison; a case without numbers says why after it); "
            "the variant cell adds the kernel that ran, when stored, and what it computes. "
            "Exponents: time per token ∝ L^exponent over "
            "every measured length, and over all but the shortest (where per-token overheads "
            f"weigh most); both need `{MIN_FIT_LENGTHS}` lengths or more. Times set aside "
            "(busy or unstable) are shown, never fitted or divided."
        ),
        ctx.set_aside(),
    )
    prefills = _mode(ctx, "prefill")
    for index, (setting, part) in enumerate(decoded.groupby("setting", sort=True)):
        blocks.append(Heading(2, f"`{setting}`"))
        ok = part[part["status"] == OK]
        panels = {TIME: "time per token", STATE: "decoding state per sequence"}
        path = scaling_plot(
            ok, setting, ctx.out_dir / f"decoding-{index + 1}.png", panels, "context length L"
        )
        if path is not None:
            ctx.plots.append(path)
            blocks.append(Image(path, f"time per token and state against context: {setting}"))
        blocks.append(_table(ctx, part, prefills))
        blocks.append(_exponents(ctx, ok))
        if ratios := _recompute_ratios(ctx, ok):
            blocks.append(ratios)
    return blocks


def _prefill_of(row: Any, prefills: Any) -> Any:
    """The prefill case of a decode case's prompt (same setting but the mode, variant, length)."""
    if prefills.empty:
        return None
    same = prefills
    for column in SAME_PROMPT:
        same = same[same[column] == row[column]]
    return None if same.empty else same.iloc[-1]


def _table(ctx: Context, part: Any, prefills: Any) -> Table:
    rows = []
    for _, row in part.sort_values(["seq_len", "variant"]).iterrows():
        prefill = _prefill_of(row, prefills)
        rows.append(
            [
                ctx.config(row, "seq_len"),
                variant_cell(row),
                "; ".join(t for t in (decoding_text(row), note(row)) if t),
                ctx.metric(row, TIME, mark_time=True),
                ctx.metric(prefill, TIME, mark_time=True) if prefill is not None else "-",
                ctx.metric(row, STATE),
                ctx.metric(row, MEMORY),
            ]
        )
    headers = [
        "L",
        "variant",
        "decodes",
        header(TIME, "time per token"),
        header(TIME, "prefill"),
        header(STATE),
        header(MEMORY, "peak per token"),
    ]
    return Table(headers, rows)


def _exponent(ctx: Context, inputs: list[Any]) -> str:
    if len({c["seq_len"] for _, c, _ in inputs}) < MIN_FIT_LENGTHS:
        return NOT_ENOUGH
    return ctx.ledger.derive("exponent", "exponent", inputs)[1]


def _exponents(ctx: Context, ok: Any) -> Table:
    rows = []
    for variant, vpart in ok.groupby("variant", sort=True):
        times = fit_inputs(ctx, vpart, TIME)
        shortest = min((c["seq_len"] for _, c, _ in times), default=0)
        rows.append(
            [
                f"`{variant}`",
                computes(vpart.iloc[0]),
                _exponent(ctx, times),
                _exponent(ctx, [i for i in times if i[1]["seq_len"] > shortest]),
                _exponent(ctx, fit_inputs(ctx, vpart, STATE)),
            ]
        )
    headers = [
        "variant",
        "computes",
        "time per token exponent",
        "without the shortest L",
        "state exponent",
    ]
    return Table(headers, rows, caption="Fitted exponents (value ∝ L^exponent).")


def _recompute_ratios(ctx: Context, ok: Any) -> Table | None:
    """Per backend measured both ways: recomputing the prefix / its own decoding, per length."""
    own = {
        (r["backend"], r["seq_len"]): r
        for _, r in ok.iterrows()
        if r["config"].get("decoder", "own") != RECOMPUTE
    }
    rows = []
    for _, r in ok.sort_values(["backend", "seq_len"]).iterrows():
        mine = own.get((r["backend"], r["seq_len"]))
        if r["config"].get("decoder") != RECOMPUTE or mine is None:
            continue
        ratio = "-"
        if trusted(r, TIME) and trusted(mine, TIME):
            inputs = [ctx.input(r, TIME), ctx.input(mine, TIME)]
            ratio = ctx.ledger.derive("ratio", "ratio", inputs)[1]
        rows.append([ctx.config(r, "seq_len"), f"`{r['backend']}`", ratio])
    if not rows:
        return None
    return Table(
        ["L", "backend", "recompute / own, per token"],
        rows,
        caption="How many times longer a token takes when the whole prefix is recomputed.",
    )


def cheapest(ctx: Context) -> list[Any]:
    """The summary's generation lines: per decode setting and context length, the backend whose
    tokens cost least in each class with its own decoding, and the smallest decoding state."""
    decoded = _mode(ctx, "decode")
    if not decoded.empty:  # each backend's own decoding (recomputing is the comparison)
        own = [c.get("decoder", "own") != RECOMPUTE for c in decoded["config"]]
        decoded = decoded[own]
    blocks: list[Any] = []
    for setting, part in decoded.groupby("setting", sort=True):
        rows = []
        for _, at_n in part[part["status"] == OK].groupby("seq_len", sort=True):
            fast, lean = best(at_n, TIME), best(at_n, STATE)
            leanest = [r for r in lean.values() if r is not None]  # either class
            picks = (
                (fast[EXACT_CLASS], TIME),
                (fast[APPROX_CLASS], TIME),
                (min(leanest, key=lambda r: r["metrics"][STATE]) if leanest else None, STATE),
            )
            cells = [ctx.config(at_n.iloc[0], "seq_len")]
            for row, metric in picks:
                if row is None:
                    cells.append("none ranked")
                    continue
                cells.append(named_value(ctx, row, metric) + tie_text(tied(at_n, row, metric)))
            rows.append(cells)
        if rows:
            blocks.append(
                Table(
                    [
                        "L",
                        f"cheapest token, {EXACT_CLASS}",
                        f"cheapest token, {APPROX_CLASS}",
                        "smallest state",
                    ],
                    rows,
                    caption=(
                        f"Generation (`{setting}`): per context length, the backend with the "
                        "smallest median time per generated token in each class (times set "
                        f"aside never ranked), and the smallest decoding state ([{TITLE}]"
                        f"(#{TITLE.lower()}))."
                    ),
                )
            )
    return blocks
