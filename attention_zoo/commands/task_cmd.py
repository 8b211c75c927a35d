"""`zoo task`: train and evaluate attention variants on synthetic tasks; print Table 2."""

from __future__ import annotations

import argparse
import logging
import sys
from collections import defaultdict

import torch

from ..errors import Interrupted, UsageError, ZooError
from ..executors import Executor, add_executor_args, executor_from_args
from ..store import DEFAULT_STORE
from .validate import (
    check_device,
    given,
    integer,
    integers,
    names,
    reject_together,
    store_path,
)

EXAMPLE = """examples:
  zoo task duplication --preset cpu --table2       Table 2 of the Reformer paper, on this CPU
  zoo task duplication --preset smoke              < 1 minute pipeline check
  zoo task my-suite.toml --preset cpu --backends shared-qk,local --seeds 0,1
  zoo task duplication --preset cpu --backends lsh --train-hashes 2 --eval-hashes 8,1
  zoo task associative-recall --preset cpu
  zoo task --table2                                the matrix from every stored run
  zoo task --list                                  tasks and their presets
  zoo task duplication --preset paper --device cuda --executor ray --ray-address auto
                                                   one Ray task (one GPU) per training run

RUN_SPEC is a suite file (TOML) or a task name, looked up as <name>.toml in each folder of
$ZOO_TASKS_DIR (separated by ':'), then ./tasks, then among the built-in suites.
Runs already in the store (same task, preset, model, variant, seed) are not trained again
unless --force. Judge variants by steps; wall time depends on what else the machine runs.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "task",
        help="train attention variants on synthetic tasks (Reformer Table 2)",
        description="Train and evaluate attention variants on a synthetic task suite; results go "
        "to the store; --table2 prints the Reformer's Table 2 matrix from the stored runs.",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "run_spec", nargs="?", metavar="RUN_SPEC", help="suite file (.toml) or task name"
    )
    p.add_argument("--preset", default="cpu", help="preset of the suite (default: %(default)s)")
    p.add_argument(
        "--backends",
        type=names,
        help="attention mixes to train, comma-separated ('local+lsh' = alternating layers)",
    )
    p.add_argument("--seeds", type=integers(0), help="run seeds, comma-separated")
    p.add_argument(
        "--train-hashes", type=integers(1), help="num_hashes for lsh while training, e.g. 4,2,1"
    )
    p.add_argument(
        "--eval-hashes",
        type=integers(1, allow_empty=True),
        help="num_hashes at evaluation, e.g. 8,4,2,1 (empty: '')",
    )
    p.add_argument("--max-steps", type=integer(1), help="override the preset's step cap")
    p.add_argument(
        "--device",
        "--devices",
        dest="device",
        help="device to train on: cpu, cuda or cuda:N (default: cpu)",
    )
    p.add_argument(
        "--threads",
        type=integer(1),
        help="torch intra-op threads (default: torch's choice; "
        "on a busy machine 1 is often fastest for these small models)",
    )
    p.add_argument(
        "--store",
        help=f"SQLite results file; its folder must exist (default: {DEFAULT_STORE})",
    )
    p.add_argument("--table2", action="store_true", help="print the Table 2 matrix from the store")
    p.add_argument("--force", action="store_true", help="train again even if the store has the run")
    p.add_argument(
        "--cost",
        action="store_true",
        help="also measure one training step of each variant's model at the task's length and "
        "batch (time, memory) into the store: the report's Accuracy x cost joins them",
    )
    p.add_argument("--list", action="store_true", help="list tasks and their suite presets")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_executor_args(p)
    p.set_defaults(run=run)


TRAINING_FLAGS = (
    "backends",
    "seeds",
    "train_hashes",
    "eval_hashes",
    "max_steps",
    "device",
    "threads",
    "force",
    "cost",
    "quiet",
)


def check_flags(args: argparse.Namespace) -> None:
    """Flags that conflict or would do nothing, refused before anything is loaded or trained."""
    if args.list:
        if args.run_spec is not None:
            raise UsageError("--list takes no RUN_SPEC: it lists every task and its presets")
        for flag in ("table2", *TRAINING_FLAGS):
            reject_together(args, "list", flag, "--list only lists the tasks and their presets")
    elif args.run_spec is None:
        for flag in TRAINING_FLAGS:
            if given(args, flag):
                raise UsageError(
                    f"--{flag.replace('_', '-')} needs a RUN_SPEC (a task name or suite file) "
                    "to train; --table2 alone only prints stored results"
                )


def run(args: argparse.Namespace) -> int:
    from ..tasks.base import TASKS

    check_flags(args)
    if args.device is not None:
        check_device(args.device, flag="--device", present=True)
    args.device = args.device or "cpu"
    store = str(store_path(args.store, DEFAULT_STORE))
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.list or (args.run_spec is None and not args.table2):
        print(_list_tasks(TASKS.names()))
        return 0 if args.list else 2
    if args.run_spec is None:  # --table2 alone: every stored task/preset
        return _print_tables(store, task=None, preset=None)
    preset = _run_suite(args, store)
    if args.table2:
        return _print_tables(store, task=preset.task.name, preset=preset.name)
    return 0


def _run_suite(args: argparse.Namespace, store: str):  # -> TaskPreset
    with executor_from_args(args) as executor:
        return _train_suite(args, store, executor)


def _train_suite(args: argparse.Namespace, store: str, executor: Executor):  # -> TaskPreset
    import dataclasses

    from ..tasks.driver import run_key, train_runs
    from ..tasks.results import TaskResults
    from ..tasks.runner import identity, plan_runs, skipped_key
    from ..tasks.suite import load_task_preset

    preset = load_task_preset(args.run_spec, args.preset)
    if args.max_steps:
        preset = dataclasses.replace(
            preset, train=dataclasses.replace(preset.train, max_steps=args.max_steps)
        )
    runs, skipped = plan_runs(
        preset,
        backends=args.backends,
        seeds=args.seeds,
        train_hashes=args.train_hashes,
        eval_hashes=args.eval_hashes,
        device=args.device,
    )
    print(f"{preset.task.name} / preset {preset.name}: {preset.description}", flush=True)
    print(
        f"{preset.task}; threads {args.threads or torch.get_num_threads()}; store {store}; "
        f"executor {executor.describe()}",
        flush=True,
    )
    meta = {
        "command": "zoo task",
        "argv": sys.argv[1:],
        "suite": preset.suite,
        "preset": preset.name,
    }
    todo, stored = [], 0
    try:
        with TaskResults(store, meta=meta, device=args.device) as results:
            for s in skipped:
                print(f"skipped {s.label}: {s.reason}", flush=True)
                for seed in args.seeds or preset.grid.seeds:
                    results.save_skipped(
                        identity(preset, s.label, seed),
                        skipped_key(preset, s.label, seed),
                        s.reason,
                    )
            for spec in runs:
                if not args.force and results.has_run(
                    spec.key(), identity(preset, spec.variant.label, spec.seed)
                ):
                    print(
                        f"{spec.variant.label} seed {spec.seed}: already in the store "
                        "(use --force to train again)",
                        flush=True,
                    )
                else:
                    todo.append(spec)
            finished = 0

            def report(spec, outcome) -> None:
                nonlocal finished
                finished += 1
                if outcome.ok:
                    text = _summary(outcome.value)
                else:
                    text = f"{'oom' if outcome.oom else 'error'} (stored): {outcome.error}"
                print(
                    f"[{finished}/{len(todo)}] {spec.variant.label} seed {spec.seed}: {text}",
                    flush=True,
                )

            try:
                train_runs(
                    todo,
                    results,
                    executor,
                    device=args.device,
                    threads=args.threads,
                    progress=not args.quiet,
                    on_done=report,
                )
            except KeyboardInterrupt:
                stored = results.stored({run_key(spec) for spec in todo})
                raise
            stored = len(todo)  # every run is stored; Ctrl-C may still come while the run is closed
    except KeyboardInterrupt:
        raise Interrupted(
            f"interrupted: {stored} of {len(todo)} training run(s) finished and stored in "
            f"{store} (run marked interrupted); rerun the same command to train only the "
            "missing ones"
            if stored
            else "interrupted before any training run finished; nothing new was stored"
        ) from None
    if args.cost and runs:
        _measure_cost(runs, store, args, executor)
    return preset


def _measure_cost(runs, store: str, args: argparse.Namespace, executor: Executor) -> None:
    """Time and peak memory of a training step of each trained model, as bench rows."""
    from ..measure.runner import MeasureSettings
    from ..store import ResultStore
    from ..sweep import run_sweep
    from ..tasks.cost import cost_cases

    cases = cost_cases(runs, device=args.device)
    settings = MeasureSettings(metrics=("time", "memory"), threads=torch.get_num_threads())
    print(f"measuring the training-step cost of {len(cases)} model(s)", flush=True)
    with ResultStore(store) as results:
        run_sweep(
            cases,
            results,
            settings=settings,
            progress=not args.quiet,
            meta={"command": " ".join(["zoo", *sys.argv[1:]])},
            executor=executor,
        )


def _summary(outcome) -> str:
    r = outcome.result
    target = round(outcome.spec.preset.train.target_accuracy * 100)
    reached = (
        f"{target}% at step {r.steps_to_target}" if r.steps_to_target else f"{target}% not reached"
    )
    evals = ", ".join(f"{k} {100 * v.accuracy:.1f}%" for k, v in outcome.evals.items())
    text = (
        f"{reached}; final {100 * r.final_accuracy:.1f}% after {r.steps} steps "
        f"({r.wall_time_s:.0f} s)"
    )
    return text + (f"; eval {evals}" if evals else "")


def _print_tables(store: str, *, task: str | None, preset: str | None) -> int:
    from ..tasks import results
    from ..tasks.base import tabulation_of
    from ..tasks.tabulate import build_matrix, format_matrix

    rows = results.load_rows(store, task=task, preset=preset)
    if not rows:
        print(f"no stored task runs in {store}" + (f" for {task} / {preset}" if task else ""))
        return 1
    groups = defaultdict(list)
    for r in rows:
        groups[(r["task"], r["preset"], r["length"])].append(r)
    for (t, p, n), group in sorted(groups.items()):
        print(f"\n{t} / preset {p} (length {n}): accuracy on the scored positions")
        print(format_matrix(build_matrix(group, tabulation_of(t))))
    return 0


def _list_tasks(names: list[str]) -> str:
    from ..tasks.suite import find_suite, preset_names

    lines = ["tasks (zoo task NAME --preset PRESET):"]
    for name in names:
        try:
            presets = ", ".join(preset_names(name))
            where = find_suite(name)
        except ZooError as err:
            presets, where = "-", err
        lines.append(f"  {name}: presets {presets}  ({where})")
    return "\n".join(lines)


logging.getLogger(__name__).addHandler(logging.NullHandler())
