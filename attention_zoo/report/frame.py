"""Stored rows -> one row per measured case, with every parameter that tells cases apart.

Selection rule (stated in every report): for each configuration — every case parameter with options
resolved against their defaults, plus the device name and thread count — the latest stored run is
shown; earlier runs of the same configuration are counted, not averaged. Timings taken while other
processes left too few cores free, or whose repeats disagreed (measure/trust.py), are marked and set
aside; the cores left free are read around each case's timing, and only a case without that
reading falls back to its run's load at the run's start and end.
"""

from __future__ import annotations

import json
from typing import Any

from ..config import ReformerConfig
from ..measure.cases import BenchCase
from ..measure.labels import case_kind, case_label, kernel_text, measured_on_peer, resolve_options
from ..measure.load import SAMPLED, busy_at_end, busy_at_start
from ..measure.table import group_cases
from ..measure.timing import CPU_CLOCK
from ..measure.trust import BUSY, CPU_TIMED, UNSTABLE, busy_threads, timing_marks

SELECTION_RULE = (
    "one row per configuration (every case parameter, options resolved against their defaults, "
    "device name and threads): the latest stored run of it; earlier runs of the same "
    "configuration stay in the store and are never averaged in"
)
# The parameters that tell bench cases apart besides the variant and the length.
SETTING = (
    "target",
    "mode",
    "causal",
    "batch",
    "num_heads",
    "head_dim",
    "hidden",
    "new_tokens",
    "dtype",
    "device",
    "device_name",
    "threads",
    "clock",
)
TASK_KIND = "task"
CPU_TIME = "CPU time"  # a setting timed by the process's CPU time (trust.CPU_TIMED), so named


def case_frame(rows: Any, runs: list[dict[str, Any]] | None = None) -> Any:
    """Store rows (ResultStore.rows() dicts or to_dataframe()) -> one row per stored case.

    Columns: measure.table.group_cases' (run_id, case_key, status, error, config, metrics,
    device_name, threads, git_commit, torch_version, created_at), kind (bench|task|other), and the
    run's kind, start, load_start, load_end, cpu_count, the busy flag (the cores left free while
    the case was timed; without that reading, the run's load at its ends; None: no load recorded),
    the unstable flag and the marks' reasons."""
    import pandas as pd

    records = rows.to_dict("records") if hasattr(rows, "to_dict") else list(rows)
    # a DataFrame holds NaN where the store has NULL (no metric, no error)
    records = [{k: (None if _nan(v) else v) for k, v in r.items()} for r in records]
    cases = group_cases(records)
    for case in cases:
        case["error"] = case["error"] or ""
        case["threads"] = int(case["threads"])
        case["kind"] = _kind(case["config"])
        case["metrics"] = {k: float(v) for k, v in case["metrics"].items() if v is not None}
    run_info = {r["run_id"]: r for r in runs or []}
    out = []
    for case in cases:
        run = run_info.get(case["run_id"], {})
        load_start, load_end = run.get("load_start"), run.get("load_end")
        cpu_count = run.get("cpu_count")
        device = case["config"].get("device", "cpu")
        run_busy = _run_busy(run, busy_threads(device, case["threads"]))
        marks = timing_marks(
            case["metrics"], threads=case["threads"], device=device, run_busy=run_busy
        )
        kinds = {m.kind for m in marks}
        busy = None  # the case's own reading decides when it has one; else the run's load
        if case["metrics"].get(CPU_TIMED):  # the process's CPU time: never busy
            busy = False
        elif "free_cores" in case["metrics"]:
            busy = BUSY in kinds
        elif _load_recorded(run):
            busy = run_busy is not None
        out.append(
            {
                **case,
                "run_kind": run.get("kind", ""),
                "run_started": run.get("started_at"),
                "load_start": load_start,
                "load_end": load_end,
                "cpu_count": cpu_count,
                "busy": busy,
                "clock": _clock(case, run),
                "unstable": UNSTABLE in kinds,
                "marks": [m.reason for m in marks],
            }
        )
    frame = pd.DataFrame(out)
    if frame.empty:
        return frame
    return frame.sort_values("created_at", kind="stable").reset_index(drop=True)


def _clock(case: dict[str, Any], run: dict[str, Any]) -> str:
    """CPU_TIME for a case timed by the process's CPU time, or one of a run timed so that has
    no time (unavailable, failed): it belongs to that run's settings; else ''."""
    if case["metrics"].get(CPU_TIMED):
        return CPU_TIME
    settings = (run.get("meta") or {}).get("settings") or {}
    on_cpu = case["config"].get("device", "cpu") == "cpu"
    timed = "time_median" in case["metrics"]
    return CPU_TIME if on_cpu and not timed and settings.get("clock") == CPU_CLOCK else ""


def _run_busy(run: dict[str, Any], threads: int) -> str | None:
    """Why the run's load at its start or end was busy for `threads` (None: idle or unknown)."""
    cores, start, end = run.get("cpu_count"), run.get("load_start"), run.get("load_end")
    if not cores:
        return None
    if start is not None and busy_at_start(start, cores, threads):
        return f"the run's load at its start was {start:.2f} on {cores} cores"
    sampled = (run.get("meta") or {}).get("load") == SAMPLED
    if end is not None and busy_at_end(end, cores, threads, sampled=sampled):
        return f"the run's load at its end was {end:.2f} on {cores} cores"
    return None


def _load_recorded(run: dict[str, Any]) -> bool:
    """Whether the run recorded a load at either end, and its cores."""
    return bool(run.get("cpu_count")) and (
        run.get("load_start") is not None or run.get("load_end") is not None
    )


def _nan(value: Any) -> bool:
    return isinstance(value, float) and value != value


def _kind(config: dict[str, Any]) -> str:
    if config.get("kind") == TASK_KIND:
        return "task"
    return "bench" if "seq_len" in config and "backend" in config else "other"


def bench_frame(cases: Any) -> Any:
    """Bench cases with their parameters as columns, variant labels, what each variant computes
    (`computes`: full, pattern, approximate; labels.backend_kind), setting and identity.

    `variant` is the case label plus, for model cases, the model fields that differ between cases
    of the same setting (e.g. `[num_hidden_layers=4, residual=reversible]`)."""
    if cases.empty:
        return cases
    bench = cases[cases["kind"] == "bench"].copy()
    if bench.empty:
        return bench
    cfg = bench["config"]
    bench["target"] = [c.get("target", "?") for c in cfg]
    bench["backend"] = [str(c.get("backend", "?")) for c in cfg]
    bench["mode"] = [c.get("mode", "?") for c in cfg]
    bench["causal"] = [bool(c.get("causal", True)) for c in cfg]
    bench["seq_len"] = [int(c["seq_len"]) for c in cfg]
    for name, default in (("batch", 1), ("num_heads", 0), ("head_dim", 0), ("hidden", 0)):
        bench[name] = [int(c.get(name, default)) for c in cfg]
    bench["hidden"] = [
        0 if t == "attention" else h for t, h in zip(bench["target"], bench["hidden"])
    ]  # the attention target has no hidden size
    bench["new_tokens"] = [int(c.get("new_tokens") or 0) for c in cfg]  # prefill, decode
    bench["dtype"] = [c.get("dtype", "?") for c in cfg]
    bench["device"] = [c.get("device", "?") for c in cfg]
    bench["peer"] = [measured_on_peer(c) for c in cfg]
    bench["note"] = [str(c.get("note") or c.get("peer_note") or "") for c in cfg]
    bench["label"] = [case_label(c) for c in cfg]
    bench["computes"] = [case_kind(c, f) for c, f in zip(cfg, bench["facts"])]
    bench["kernel"] = [kernel_text(f) for f in bench["facts"]]
    bench["model_key"] = [_bench_model_key(c) if c.get("target") == "model" else "" for c in cfg]
    bench["setting"] = [setting_text(r) for r in bench[list(SETTING)].to_dict("records")]
    bench["variant"] = _with_model_fields(bench)
    bench["identity"] = [
        json.dumps(
            {
                "setting": s,
                "variant": v,
                "seq_len": n,
                "options": resolve_options(c.get("backend", ""), c.get("options")),
                "model": c.get("model") or {},
            },
            sort_keys=True,
            default=str,
        )
        for s, v, n, c in zip(bench["setting"], bench["variant"], bench["seq_len"], cfg)
    ]
    return bench


def reference_choices(rows: Any) -> list[str]:
    """What a report's ratios may divide by for these stored rows (ResultStore rows or frame):
    every bench variant's label, and each peer family measured (hf: each variant by its peer)."""
    bench = bench_frame(case_frame(rows))
    if bench.empty:
        return []
    families = {b.split(":", 1)[0] for b in bench["backend"] if ":" in b}
    return sorted(set(bench["label"])) + sorted(families)


def setting_text(row: dict[str, Any]) -> str:
    """The parameters shared by the rows of one table, in one line."""
    parts = [
        row["target"],
        row["mode"],
        "causal" if row["causal"] else "non-causal",
        f"batch={row['batch']}",
        f"heads={row['num_heads']}",
        f"head_dim={row['head_dim']}",
    ]
    if row["hidden"]:
        parts.append(f"hidden={row['hidden']}")
    if row.get("new_tokens"):
        parts.append(f"new_tokens={row['new_tokens']}")
    parts += [row["dtype"], f"{row['device']} ({row['device_name']})", f"threads={row['threads']}"]
    parts += [row["clock"]] if row.get("clock") else []
    return ", ".join(parts)


def _with_model_fields(bench: Any) -> list[str]:
    labels = list(bench["label"])
    for _, part in bench.groupby("setting", sort=False):
        models = [c.get("model") or {} for c in part["config"]]
        keys = sorted({k for m in models for k in m})
        varying = [
            k
            for k in keys
            if len({json.dumps(m.get(k), sort_keys=True, default=str) for m in models}) > 1
        ]
        if not varying:
            continue
        for idx, model in zip(part.index, models):
            pos = bench.index.get_loc(idx)
            extra = ", ".join(f"{k}={model.get(k)}" for k in varying if k in model)
            labels[pos] = f"{labels[pos]} [{extra}]" if extra else labels[pos]
    return labels


def latest_per_identity(frame: Any, identity: str = "identity") -> tuple[Any, Any]:
    """(the latest row of each identity, how many earlier rows each identity had)."""
    if frame.empty:
        return frame, {}
    ordered = frame.sort_values("created_at", kind="stable")
    latest = ordered.drop_duplicates(identity, keep="last")
    counts = ordered.groupby(identity).size() - 1
    return latest, {k: int(v) for k, v in counts.items() if v > 0}


def task_frame(cases: Any) -> Any:
    """Task training runs (ok) with identity columns, metrics, and the model key of their model.

    Rows stored twice (the same run in two invocations) count once: the latest."""
    if cases.empty:
        return cases
    tasks = cases[(cases["kind"] == "task") & (cases["status"] == "ok")].copy()
    if tasks.empty:
        return tasks
    cfg = tasks["config"]
    for name in ("task", "preset", "backend", "length", "seed"):
        tasks[name] = [c.get(name) for c in cfg]
    tasks["length"] = tasks["length"].astype(int)
    tasks["model_fields"] = [(c.get("spec") or {}).get("model") or {} for c in cfg]
    tasks["batch"] = [_train_batch(c) for c in cfg]
    tasks["model_key"] = [model_key(m) for m in tasks["model_fields"]]
    latest, _ = latest_per_identity(tasks, "case_key")
    return latest


def _train_batch(config: dict[str, Any]) -> int | None:
    train = (config.get("spec") or {}).get("train") or {}
    value = train.get("batch_size")
    return int(value) if value else None


def _bench_model_key(config: dict[str, Any]) -> str:
    """The model key of a bench case of target model (its ReformerConfig as the case builds it)."""
    try:
        fields = {k: v for k, v in config.items() if k in BenchCase.__dataclass_fields__}
        return model_key(BenchCase.from_dict(fields).reformer_config().to_dict())
    except Exception:  # a case this version cannot rebuild has no key to join on
        return ""


def model_key(fields: dict[str, Any]) -> str:
    """Canonical identity of a model configuration (ReformerConfig resolved; head size filled in),
    so a task's model and a bench case's model compare equal when they are the same model."""
    if not fields:
        return ""
    try:
        config = ReformerConfig.from_dict(dict(fields)).to_dict()
    except Exception:  # a config this version cannot read: compare it as stored
        config = dict(fields)
    if config.get("attention_head_size") is None and config.get("num_attention_heads"):
        config["attention_head_size"] = config["hidden_size"] // config["num_attention_heads"]
    return json.dumps(config, sort_keys=True, default=str)
