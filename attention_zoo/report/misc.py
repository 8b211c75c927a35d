"""Cases without numbers and provenance sections."""

from __future__ import annotations

import time
from typing import Any

from ..measure.labels import case_kind, kind_text
from ..measure.load import SLACK
from ..measure.status import STATUS_TEXT
from ..measure.trust import UNSTABLE_IQR, UNSTABLE_MIN
from .context import Context
from .document import Heading, Para, Table
from .frame import SELECTION_RULE


def _case_name(row: Any) -> str:
    config = row["config"]
    if row["kind"] == "task":
        return f"{config.get('task')}/{config.get('preset')} {config.get('backend')}"
    return row.get("variant") or str(config.get("backend", "?"))


def missing(ctx: Context) -> list[Any]:
    bad = ctx.cases[ctx.cases["status"] != "ok"] if not ctx.cases.empty else ctx.cases
    blocks: list[Any] = [Heading(1, "Cases without numbers")]
    if bad.empty:
        return [*blocks, Para("Every selected case produced its numbers.")]
    variants = dict(zip(ctx.bench["case_key"], ctx.bench["variant"])) if not ctx.bench.empty else {}
    settings = dict(zip(ctx.bench["case_key"], ctx.bench["setting"])) if not ctx.bench.empty else {}
    rows = []
    for _, r in bad.iterrows():
        name = variants.get(r["case_key"]) or _case_name(r)
        length = r["config"].get("seq_len") or r["config"].get("length")
        rows.append(
            [
                f"`{name}`",
                kind_text(case_kind(r["config"], r.get("facts"))),
                f"`{settings.get(r['case_key'], r['kind'])}`",
                ctx.config(r, "config.seq_len" if "seq_len" in r["config"] else "config.length")
                if length is not None
                else "-",
                STATUS_TEXT.get(r["status"], r["status"]),
                f"`{r['error']}`" if r["error"] else "-",
            ]
        )
    return [*blocks, Table(["case", "computes", "setting", "L", "status", "reason"], rows)]


def _date(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(ts)) if ts else "-"


def _busy_per_run(cases: Any) -> dict[str, bool | None]:
    """run_id -> busy when any of its shown cases was busy (None: no load recorded)."""
    out: dict[str, bool | None] = {}
    for run_id, busy in zip(cases["run_id"], cases["busy"]) if not cases.empty else ():
        if busy is not None and busy == busy:  # NaN: no load recorded
            out[run_id] = bool(out.get(run_id)) or bool(busy)
        else:
            out.setdefault(run_id, None)
    return out


def provenance(ctx: Context) -> list[Any]:
    used = set(ctx.cases["run_id"]) if not ctx.cases.empty else set()
    runs = [r for r in ctx.runs if r["run_id"] in used]
    busy = _busy_per_run(ctx.cases)
    rows = []
    for r in runs:

        def run_number(name: str, kind: str, run: dict[str, Any] = r) -> str:
            value = run.get(name)
            return (
                "-"
                if value is None
                else ctx.ledger.value(kind, value, [run["run_id"], "", f"run.{name}"])
            )

        state = busy.get(r["run_id"])
        threads, cores = (
            f"{run_number(name, 'count')} {word}{'' if r.get(name) == 1 else 's'}"
            for name, word in (("threads", "thread"), ("cpu_count", "core"))
        )
        machine = f"`{r['torch_version']}` · `{r['device_name']}` · {threads} · {cores}"
        rows.append(
            [
                f"`{r['run_id']}`",
                r["kind"],
                f"`{_date(r['started_at'])}`",
                f"`{r['git_commit']}`"
                + (" (dirty)" if str(r["git_commit"]).endswith("+dirty") else ""),
                machine,
                f"{run_number('load_start', 'load')} → {run_number('load_end', 'load')}",
                "unknown" if state is None else ("yes" if state else "no"),
            ]
        )
    blocks: list[Any] = [
        Heading(1, "Provenance"),
        Para(f"Report built `{_date(time.time())}`. Selection: {SELECTION_RULE}."),
        Para(
            "Busy rule: a time is marked busy (†) and set aside when other processes left fewer "
            f"free cores than `threads - {SLACK}` while it was timed (`free_cores`, read around "
            "each case's timing; on CUDA only the launching thread counts). A case without that "
            "reading falls back to its run's load: busy when the load at the run's start "
            f"exceeded `cores - threads + {SLACK}`, or at its end the same (a load sampled from "
            "the CPU counters, which excludes the run's finished threads) or "
            f"`cores + {SLACK}` (a one-minute load average, which includes them). Unstable (‡): "
            "repeats that still disagreed after the case's group was timed again (IQR above "
            f"`{UNSTABLE_IQR:.0%}` of the median, or the fastest repeat below "
            f"`{UNSTABLE_MIN:.0%}` of it). A run is busy below when any of its shown cases was. "
            "Memory and FLOPs do not depend on load. A run's **machine**: its torch, device, "
            "threads and the machine's cores; its **load** at its start and its end."
        ),
    ]
    if ctx.earlier_runs:
        blocks.append(
            Para(
                "Configurations measured in more than one run show only the latest; the earlier "
                "rows stay in the store (`zoo results`)."
            )
        )
    if rows:
        blocks.append(
            Table(
                ["run", "kind", "started", "git commit", "machine", "load start → end", "busy"],
                rows,
            )
        )
    return blocks
