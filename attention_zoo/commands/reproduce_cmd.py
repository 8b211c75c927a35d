"""`zoo reproduce NAME`: run a registered reproduction's experiments; print its claims, verdicts."""

from __future__ import annotations

import argparse
import sys

from ..argtypes import integer
from ..engine import RunPolicy
from ..errors import UsageError
from ..executors import add_executor_args, executor_from_args
from ..reproduce import (
    OWN_SETTINGS,
    PRESETS,
    RunOptions,
    get_reproduction,
    list_reproductions,
    render_claims,
)
from ..store import DEFAULT_STORE, open_store, preview_store
from ..tasks.driver import TaskRequest, train_task
from .parsers import add_command
from .recording import recorded_command
from .run_flags import add_run_args, policy_from_args, run_rule_text

DEFAULT_SCALE = "cpu"

HELP = "run the experiments behind a paper's claims; print claims with verdicts"
DESCRIPTION = (
    "Run the experiments behind a paper's published claims (a registered "
    "reproduction: the Reformer's, or a plugin's), store them, and print each claim: the "
    "published figure, ours as the same kind of ratio, and a verdict."
)
EXAMPLE = """examples:
  zoo reproduce --list                          the registered reproductions
  zoo reproduce reformer                        claims a-e at CPU scale (<= 15 min on 2 cores)
  zoo reproduce reformer --with-table2          ... and Table 2 (the duplication task; long)
  zoo reproduce reformer --preset smoke         the whole pipeline at toy sizes (< 2 min; CI)
  zoo reproduce zoology --preset cpu            a preset names the size: smoke, cpu, gpu or paper
  zoo reproduce lra-listops --settings lra      each backend as LRA's row ran it (hashes, chunk,
                                                features, window, k) instead of the preset's
  zoo reproduce reformer --scale paper          the published settings: measured on CUDA,
                                                predicted on the meta device without it
  zoo report                                    the report, with its Claims section

The Reformer's claims (published figures: HF blog 'The Reformer - Pushing the limits of language
modeling', and the Reformer paper's Table 2): a. inference memory of local+LSH vs global attention
(and vs SDPA); b. chunked feed-forward; c. reversible vs standard residuals, per layer; d. axial
position embeddings (parameters, memory); e. a 0.5M-token training step in 8 GB; f. Table 2's
pattern. Each is compared as a ratio of the same kind, with the verdict rule printed beside it.
Memory is measured with the profiler on CPU (or CUDA's allocator); 'predicted' marks meta-device
numbers. Rows go to --store; an interrupted run resumes when the same command is run again, and a
finished one is not measured again (--force, or its old name --fresh, measures anew). Plugins
(--import MODULE) may register more reproductions.

%(rule)s
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    epilog = EXAMPLE % {"rule": run_rule_text()}
    p = add_command(sub, "reproduce", HELP, DESCRIPTION, epilog)
    p.add_argument(
        "paper",
        nargs="?",
        metavar="NAME",
        help="which reproduction (reformer; --list lists the registered ones)",
    )
    p.add_argument("--list", action="store_true", help="list the registered reproductions")
    p.add_argument(
        "--scale",
        choices=["cpu", "paper"],
        default=None,
        help="cpu: scaled to minutes on 2 cores (default); paper: the published settings",
    )
    p.add_argument(
        "--preset",
        choices=["full", *PRESETS],
        default="full",
        help="smoke: the whole pipeline at toy sizes, task runs included; cpu, gpu or paper: "
        "that size (default: full, at --scale)",
    )
    p.add_argument(
        "--settings",
        default=OWN_SETTINGS,
        help="whose attention options the task runs use: preset (scaled to the preset's "
        "lengths; default) or, where the reproduction has them, the paper's own (lra)",
    )
    p.add_argument(
        "--with-tasks",
        "--with-table2",
        dest="with_tasks",
        action="store_true",
        help="also train the reproduction's long task runs (the Reformer: Table 2's models, zoo "
        "task duplication at the scale's preset)",
    )
    p.add_argument("--threads", type=integer(1), help="torch threads, fixed and recorded")
    p.add_argument("--store", help=f"SQLite results file (default: {DEFAULT_STORE})")
    add_run_args(p, force_aliases=("--fresh",))
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_executor_args(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.list:
        if args.paper is not None:
            raise UsageError("--list takes no NAME: it lists every registered reproduction")
        print(list_reproductions())
        return 0
    if args.paper is None:
        raise UsageError("name a reproduction (zoo reproduce --list lists them)")
    reproduction = get_reproduction(args.paper)
    size = _size(args)
    if size not in reproduction.sizes:
        raise UsageError(
            f"reproduction {reproduction.name!r} has no size {size!r}; sizes: "
            + ", ".join(reproduction.sizes)
        )
    if args.settings not in reproduction.settings:
        raise UsageError(
            f"reproduction {reproduction.name!r} has no settings {args.settings!r}; settings: "
            + ", ".join(reproduction.settings)
        )
    device = reproduction.device(size)
    policy = policy_from_args(args, default=RunPolicy(resume=True))
    executor = executor_from_args(args)
    try:
        store = preview_store(args.store) if policy.dry_run else open_store(args.store, write=True)
    except BaseException:  # one line, as every command's error (cli.main); nothing left open
        executor.close()
        raise
    with store, executor:
        for line in reproduction.announce(size, device, str(store.path)):
            print(line)
        if args.settings != OWN_SETTINGS:
            print(f"attention settings: {args.settings} (each mapped backend as the paper ran it)")
        options = RunOptions(
            device=device,
            threads=args.threads,
            policy=policy,
            progress=not args.no_progress,
            meta={"command": recorded_command(args.argv)},
            executor=executor,
            settings=args.settings,
        )
        try:
            sweeps = reproduction.run(size, store, options)
        except KeyboardInterrupt:
            print(
                "\ninterrupted: every finished case is stored; run the same command again to "
                "measure only the missing ones",
                file=sys.stderr,
            )
            return 130
        if not policy.dry_run:
            for sweep in sweeps:
                counts = ", ".join(f"{n} {s}" for s, n in sorted(sweep.counts().items()))
                print(
                    f"run {sweep.run_id}: {counts or 'nothing new'}"
                    + (f"; {sweep.already_done} already stored" if sweep.already_done else "")
                )
        for task in reproduction.task_runs(size):
            if not task.optional or args.with_tasks:
                request = TaskRequest(
                    run_spec=task.task, preset=task.preset, device=device, threads=args.threads
                )
                print(
                    f"{task.title or task.task}: zoo task {task.task} --preset {task.preset} "
                    f"--store {store.path}"
                )
                train_task(
                    request,
                    store,
                    executor=executor,
                    policy=options.task_policy,
                    progress=not args.no_progress,
                    meta=options.meta,
                )
        if policy.dry_run:
            return 0
        claims = render_claims(reproduction, store.to_dataframe())  # what the store holds now
    print(claims)
    return 0


def _size(args: argparse.Namespace) -> str:
    """The size --preset and --scale name together (a preset other than full names it)."""
    if args.preset == "full":
        return args.scale or DEFAULT_SCALE
    if args.scale not in (None, args.preset):
        raise UsageError(f"--preset {args.preset} and --scale {args.scale} disagree; give one")
    return args.preset
