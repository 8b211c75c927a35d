"""Task results in the shared results store (attention_zoo.store): the one place that talks to it.

One `zoo task` invocation is a store run of kind "task"; each training run (RunSpec) is a case whose
key is the hash of its full identity, so an identical run already stored is not trained again
(engine.RUN_RULE).
Tidy rows (task, preset, backend, length, seed, metric, value, eval) go in and come back out; the
evaluation override is kept in the metric name ("accuracy@lsh-8"; "accuracy" = as trained).
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..measure.cases import case_key
from ..measure.env import Environment
from ..measure.metrics import metric_spec
from ..measure.status import OK
from ..store import ResultStore, open_store

KIND = "task"
TRAINED = "trained"
# Where a run's accuracy as trained and its overrides are scored: the held-out test set. Runs
# stored before there was one were scored on the evaluation set that also stopped training.
SCORED_ON, SCORED_BEFORE = "test set", "evaluation set"
STOP_ACCURACY = "stop_accuracy"  # the evaluation set's accuracy at the stop: what a choice reads
_IDENTITY = ("task", "preset", "backend", "length", "seed")


def same_definition(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two stored run specs (`RunSpec.key()`, as the store gives them back) come from
    one definition of their preset, seed and evaluation overrides aside: the same model fields,
    and task and training fields equal wherever both have them (a field added to the code
    since one was stored is not held against it), scored on the same set (`scored_on`)."""
    a, b = _as_stored(a), _as_stored(b)
    if scored_on(a) != scored_on(b):
        return False
    if "model" in a and "model" in b and a["model"] != b["model"]:
        return False
    return all(_agrees(a[k], b[k]) for k in a.keys() & b.keys() - {"seed", "evals", "model"})


def scored_on(spec: Mapping[str, Any]) -> str:
    """The set a stored run's accuracy as trained was scored on (`SCORED_ON`, or before it)."""
    return str(spec.get("scored_on", SCORED_BEFORE))


def kept_by_latest_definition(
    runs: Sequence[tuple[Hashable, str, Mapping[str, Any]]],
) -> list[bool]:
    """For runs (table, backend, spec), oldest first: whether each is shown in its table (task,
    preset and length). A table shows one scoring, the held-out test set's wherever it has such a
    run (no table sets accuracies of two scorings side by side), and of those runs each backend's
    as its latest spec defines it (`same_definition`): never runs of a preset edited since, or
    trained with other --max-steps, averaged with the later ones."""
    scoring = {table: SCORED_BEFORE for table, _, _ in runs}
    for table, _, spec in runs:
        if scored_on(spec) == SCORED_ON:
            scoring[table] = SCORED_ON
    shown = [scored_on(spec) == scoring[table] for table, _, spec in runs]
    latest = {(t, b): spec for (t, b, spec), show in zip(runs, shown) if show}
    return [
        show and same_definition(spec, latest[(table, backend)])
        for (table, backend, spec), show in zip(runs, shown)
    ]


def _as_stored(spec: Mapping[str, Any]) -> Any:
    """A spec as the store's JSON gives it back (tuples as lists, other values as text)."""
    return json.loads(json.dumps(dict(spec), default=str))


def _agrees(a: Any, b: Any) -> bool:
    """Equal where both have a value: dicts key by key over the keys they share, else as values."""
    if isinstance(a, dict) and isinstance(b, dict):
        return all(_agrees(a[k], b[k]) for k in a.keys() & b.keys())
    return a == b


def case_config(identity: dict[str, Any], spec_key: dict[str, Any]) -> dict[str, Any]:
    """What the store keeps with every row of a run: the tidy identity + the full run spec."""
    return {"kind": KIND, **{k: identity[k] for k in _IDENTITY}, "spec": spec_key}


def encode_metric(metric: str, evaluation: str) -> str:
    return metric if evaluation == TRAINED else f"{metric}@{evaluation}"


def decode_metric(name: str) -> tuple[str, str]:
    metric, _, evaluation = name.partition("@")
    return metric, evaluation or TRAINED


def save_trained(
    store: ResultStore,
    run_id: str,
    spec_key: dict[str, Any],
    rows: list[dict[str, Any]],
    curves: dict[str, Any] | None = None,
    *,
    environment: Environment | None = None,
) -> str:
    """Commit one finished run's tidy rows (all share one identity) to `run_id`.

    curves (loss and eval curves) are kept in the stored config under "curves", outside the
    case identity, so a re-run of the same spec is still recognised. environment: of the
    process that trained it (None: the run's).
    """
    config = case_config(rows[0], spec_key)
    values = [
        (encode_metric(r["metric"], r["eval"]), r["value"], metric_spec(r["metric"]).unit)
        for r in rows
    ]
    stored = {**config, "curves": curves} if curves else config
    return store.add_rows(
        run_id, case_key(config), stored, values, status=OK, environment=environment
    )


def save_failed(
    store: ResultStore,
    run_id: str,
    identity: dict[str, Any],
    spec_key: dict[str, Any],
    *,
    status: str,
    error: str,
    environment: Environment | None = None,
) -> str:
    """Record a run that failed (error), ran out of memory (oom) or could not run here (skipped),
    with the reason; engine.RUN_RULE says which a later invocation tries again."""
    config = case_config(identity, spec_key)
    return store.add_rows(
        run_id, case_key(config), config, [], status=status, error=error, environment=environment
    )


def stored_rows(
    store: ResultStore, *, task: str | None = None, preset: str | None = None
) -> tuple[list[dict[str, Any]], int]:
    """Tidy rows of every finished task run in `store` (a run stored twice counts once, latest),
    each backend's at a preset and length as its latest stored definition trained them
    (`kept_by_latest_definition`: a preset edited since, trained with other --max-steps or
    scored on another set, is not mixed in), and how many runs that leaves out."""
    task_runs = {r["run_id"] for r in store.runs(kind=KIND)}
    records = [r for r in store.rows(status=OK) if r["run_id"] in task_runs]
    specs: dict[str, tuple[tuple[Any, ...], str, Any]] = {}  # case -> (table, backend, spec)
    for row in records:
        config = row["config"]
        config = json.loads(config) if isinstance(config, str) else config
        if config.get("kind") == KIND:
            table = tuple(config[k] for k in ("task", "preset", "length"))
            specs.pop(row["case_key"], None)  # re-stored: latest now
            specs[row["case_key"]] = (table, config["backend"], config.get("spec") or {})
    flags = kept_by_latest_definition(list(specs.values()))
    kept = {key for key, keep in zip(specs, flags) if keep}
    rows = tidy_rows((r for r in records if r["case_key"] in kept), task=task, preset=preset)
    left_out = {
        key
        for key, (table, _, _) in specs.items()
        if key not in kept and (task is None or table[0] == task)
        and (preset is None or table[1] == preset)
    }  # fmt: skip
    return rows, len(left_out)


def tidy_rows(
    records: Iterable[Mapping[str, Any]],
    *,
    task: str | None = None,
    preset: str | None = None,
    with_ref: bool = False,
) -> list[dict[str, Any]]:
    """Tidy rows of the task cases among stored rows (oldest first: `ResultStore.rows()`, or the
    records of its `to_dataframe()`), ok ones only; a case stored twice counts once (latest).
    with_ref: each row also names its stored case, "ref": "run/case"."""
    latest: dict[str, tuple[str, list[dict[str, Any]]]] = {}
    for row in records:
        if row["status"] != OK or not isinstance(row["metric"], str):
            continue
        config = row["config"]
        config = json.loads(config) if isinstance(config, str) else config
        if config.get("kind") != KIND:
            continue
        if (task and config["task"] != task) or (preset and config["preset"] != preset):
            continue
        metric, evaluation = decode_metric(row["metric"])
        tidy = {k: config[k] for k in _IDENTITY} | {
            "metric": metric,
            "value": row["value"],
            "eval": evaluation,
        }
        if with_ref:
            tidy["ref"] = f"{row['run_id']}/{row['case_key']}"
        seen = latest.get(row["case_key"])
        if seen is None or seen[0] != row["run_id"]:
            # rows come oldest first: a later run of the same case replaces the earlier one
            latest[row["case_key"]] = (row["run_id"], [])
        latest[row["case_key"]][1].append(tidy)
    return [r for _, rows in latest.values() for r in rows]


def load_rows(
    path: str | Path, *, task: str | None = None, preset: str | None = None
) -> tuple[list[dict[str, Any]], int]:
    """`stored_rows` of the store at `path` (none when there is no store)."""
    if not Path(path).exists():
        return [], 0
    with open_store(path, write=False) as store:
        return stored_rows(store, task=task, preset=preset)
