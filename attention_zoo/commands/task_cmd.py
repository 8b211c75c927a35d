"""`zoo task`: train and evaluate attention variants on synthetic tasks; print Table 2."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections import defaultdict
from pathlib import Path

import torch

from ..argtypes import integer, integers, names
from ..engine import RunPolicy
from ..errors import UnknownPresetError, UsageError, ZooError
from ..executors import add_executor_args, executor_from_args
from ..reproduce import REPRODUCTIONS
from ..store import DEFAULT_STORE
from ..tasks import results
from ..tasks.base import TASKS, tabulation_of
from ..tasks.driver import TaskRequest, train_task
from ..tasks.suite import MAX_SEED, TaskPreset, find_suite, load_task_preset, preset_names
from ..tasks.tabulate import build_matrix, format_matrix
from .parsers import add_command
from .recording import recorded_command
from .run_flags import add_run_args, policy_from_args, run_rule_text
from .validate import check_device, given, reject_together, require

HELP = "train attention variants on synthetic tasks (Reformer Table 2)"
DESCRIPTION = (
    "Train and evaluate attention variants on a synthetic task suite; results go "
    "to the store; --table2 prints the Reformer's Table 2 matrix from the stored runs."
)
EXAMPLE = """examples:
  zoo task duplication --preset cpu --table2       Table 2 of the Reformer paper, on this CPU
  zoo task duplication --preset smoke              < 1 minute pipeline check
  zoo task my-suite.toml --preset cpu --backends shared-qk,local --seeds 0,1
  zoo task duplication --preset cpu --backends lsh --train-hashes 2 --eval-hashes 8,1
  zoo task associative-recall --preset cpu
  zoo task --table2                                the matrix from every stored run
  zoo task --list                                  tasks and their presets
  zoo task listops --dump 3 --preset smoke --seed 1
                                                   3 generated examples as JSON lines
  zoo task niah --dump 2 --preset smoke --split n64-d50
                                                   2 sequences of one evaluation split
  zoo task duplication --preset paper --device cuda --executor ray --ray-address auto
                                                   one Ray task (one GPU) per training run

RUN_SPEC is a suite file (TOML) or a task name, looked up as <name>.toml in each folder of
$ZOO_TASKS_DIR (separated by ':'), then ./tasks, then among the built-in suites.
Runs already in the store (same task, preset, model, variant, seed) are not trained again
unless --force. Judge variants by steps; wall time depends on what else the machine runs.

%(rule)s
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    epilog = EXAMPLE % {"rule": run_rule_text()}
    p = add_command(sub, "task", HELP, DESCRIPTION, epilog)
    p.add_argument(
        "run_spec", nargs="?", metavar="RUN_SPEC", help="suite file (.toml) or task name"
    )
    p.add_argument("--preset", default="cpu", help="preset of the suite (default: %(default)s)")
    p.add_argument(
        "--backends",
        type=names,
        help="attention mixes to train, comma-separated ('local+lsh' = alternating layers)",
    )
    p.add_argument("--seeds", type=integers(0, maximum=MAX_SEED), help="run seeds, comma-separated")
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
    p.add_argument(
        "--cost",
        action="store_true",
        help="also measure one training step of each variant's model at the task's length and "
        "batch (time, memory) into the store: the report's Accuracy x cost joins them",
    )
    p.add_argument("--list", action="store_true", help="list tasks and their suite presets")
    p.add_argument(
        "--dump",
        type=integer(1),
        metavar="N",
        help="print the first N training examples of the preset's task as JSON lines "
        '{"input": ..., "target": ...} (null targets: not scored) and exit',
    )
    p.add_argument(
        "--seed",
        type=integer(0, MAX_SEED),
        help="with --dump: the run seed to draw from (default: 0)",
    )
    p.add_argument(
        "--split",
        metavar="LABEL",
        help="with --dump: print that evaluation split's sequences instead (a length or depth the "
        "task scores after training, e.g. n64-d50 of niah, pos16-31 of state-tracking)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_run_args(p)
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
    "resume",
    "run_id",
    "cost",
    "quiet",
    "dry_run",
)


def check_flags(args: argparse.Namespace) -> None:
    """Flags that conflict or would do nothing, refused before anything is loaded or trained."""
    require(args, "seed", "dump", "--seeds lists the seeds to train")
    require(args, "split", "dump", "splits are scored after training; --table2 shows them")
    if args.dump is not None:
        if args.run_spec is None:
            raise UsageError("--dump needs a RUN_SPEC: the task (or suite file) to draw from")
        for flag in ("list", "table2", *TRAINING_FLAGS):
            reject_together(args, "dump", flag, "--dump only prints generated examples")
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
    try:
        return _run(args)
    except UnknownPresetError as err:  # a preset only a reproduction derives: say which
        raise UnknownPresetError(f"{err}{_derived_hint(args.run_spec, args.preset)}") from None


def _derived_hint(task: str | None, name: str | None) -> str:
    """'; ... `zoo reproduce R --preset S` trains it' where a reproduction derives preset `name`
    of `task` (a rung of a ladder, a sweep's length), else ''."""
    for reproduction in (REPRODUCTIONS.get(r) for r in REPRODUCTIONS.names()):
        for size in reproduction.sizes:  # each size's presets read once (None: not defined)
            presets = reproduction.presets_of(size) or []
            if any((p.task.name, p.name) == (task, name) for p in presets):
                return (
                    f"; {name!r} is a preset `zoo reproduce {reproduction.name} --preset {size}` "
                    "derives from the suite and trains: run that"
                )
    return ""


def _run(args: argparse.Namespace) -> int:
    check_flags(args)
    if args.dump is not None:
        return _dump(args)
    policy = policy_from_args(args)
    if args.device is not None:
        check_device(args.device, flag="--device", present=args.executor != "ray")
    args.device = args.device or "cpu"
    store = args.store or DEFAULT_STORE
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.list or (args.run_spec is None and not args.table2):
        print(_list_tasks(TASKS.names()))
        return 0 if args.list else 2
    if args.run_spec is None:  # --table2 alone: every stored task/preset
        return _print_tables(store, task=None, preset=None)
    preset = _train(args, policy)
    if args.table2 and not policy.dry_run:  # the table of what was trained: none on a dry run
        return _print_tables(store, task=preset.task.name, preset=preset.name)
    return 0


def _train(args: argparse.Namespace, policy: RunPolicy) -> TaskPreset:
    """Train the suite the flags name, through the executor they name, into --store."""
    request = TaskRequest(
        run_spec=args.run_spec,
        preset=args.preset,
        backends=_tuple(args.backends),
        seeds=_tuple(args.seeds),
        train_hashes=_tuple(args.train_hashes),
        eval_hashes=_tuple(args.eval_hashes),
        max_steps=args.max_steps,
        device=args.device,
        threads=args.threads,
        cost=args.cost,
    )
    with executor_from_args(args) as executor:
        return train_task(
            request,
            args.store,
            executor=executor,
            policy=policy,
            progress=not args.quiet,
            meta={"command": recorded_command(args.argv)},
        )


def _dump(args: argparse.Namespace) -> int:
    """Print the preset's first generated training examples as JSON lines."""
    preset = load_task_preset(args.run_spec, args.preset)
    task, seed = preset.task, args.seed or 0
    if args.split is not None:
        examples = task.split_examples(seed, args.split, args.dump)
    else:
        examples = task.first_examples(seed, args.dump, preset.train.batch_size)
    printed = 0
    for example in examples:  # a batch at a time: the first lines come at once
        print(json.dumps(example))
        printed += 1
    if printed < args.dump:
        print(f"zoo task: note: split {args.split} holds {printed} sequences", file=sys.stderr)
    return 0


def _tuple(values: list | None) -> tuple | None:
    return None if values is None else tuple(values)


def _print_tables(store: str, *, task: str | None, preset: str | None) -> int:
    if not Path(store).exists():
        raise UsageError(
            f"no results store at {store}; train a task into it first (zoo task NAME --preset "
            "smoke --store PATH) or give the --store that holds them"
        )
    rows, left_out = results.load_rows(store, task=task, preset=preset)
    if not rows:
        raise UsageError(
            f"no stored task runs in {store}"
            + (f" for {task} / {preset}" if task else "")
            + "; train one into it first (zoo task NAME --preset smoke --store PATH)"
        )
    groups = defaultdict(list)
    for r in rows:
        groups[(r["task"], r["preset"], r["length"])].append(r)
    for (t, p, n), group in sorted(groups.items()):
        print(f"\n{t} / preset {p} (length {n}): accuracy on the scored positions")
        print(format_matrix(build_matrix(group, tabulation_of(t))))
    if left_out:
        print(
            f"\n({left_out} stored run{'s' if left_out != 1 else ''} left out: a table holds "
            "each backend's runs of its latest definition of the preset (not one edited since, "
            "or trained with other --max-steps), and runs scored on the held-out test set "
            "wherever it has some, not those scored on the evaluation set before it)"
        )
    return 0


def _list_tasks(names: list[str]) -> str:
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
