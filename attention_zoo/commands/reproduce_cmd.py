"""`zoo reproduce reformer`: the experiments behind the Reformer's claims, printed with verdicts."""

from __future__ import annotations

import argparse
import sys

from ..errors import ZooError
from ..executors import add_executor_args, executor_argv, executor_from_args
from ..store import DEFAULT_STORE, ResultStore

EXAMPLE = """examples:
  zoo reproduce reformer                        claims a-e at CPU scale (<= 15 min on 2 cores)
  zoo reproduce reformer --with-table2          ... and Table 2 (the duplication task; long)
  zoo reproduce reformer --preset smoke         the whole pipeline at toy sizes (< 2 min; CI)
  zoo reproduce reformer --scale paper          the published settings: measured on CUDA,
                                                predicted on the meta device without it
  zoo report                                    the report, with its Claims section

Claims (published figures: HF blog 'The Reformer - Pushing the limits of language modeling',
and the Reformer paper's Table 2): a. inference memory of local+LSH vs global attention (and vs
SDPA); b. chunked feed-forward; c. reversible vs standard residuals, per layer; d. axial position
embeddings (parameters, memory); e. a 0.5M-token training step in 8 GB; f. Table 2's pattern.
Each is compared as a ratio of the same kind, with the verdict rule printed beside it. Memory is
measured with the profiler on CPU (or CUDA's allocator); 'predicted' marks meta-device numbers.
Rows go to --store; an interrupted run resumes when the same command is run again, and a finished
one is not measured again (--fresh measures anew).
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "reproduce",
        help="run the experiments behind a paper's claims; print claims with verdicts",
        description="Run the experiments behind the Reformer's published claims, store them, and "
        "print each claim: the published figure, ours as the same kind of ratio, and a verdict.",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("paper", choices=["reformer"], help="which paper's claims (reformer)")
    p.add_argument(
        "--scale",
        choices=["cpu", "paper"],
        default="cpu",
        help="cpu: scaled to minutes on 2 cores (default); paper: the published settings",
    )
    p.add_argument(
        "--preset",
        choices=["full", "smoke"],
        default="full",
        help="smoke: the whole pipeline at toy sizes, Table 2 included (default: full)",
    )
    p.add_argument(
        "--with-table2",
        action="store_true",
        help="also train Table 2's models (zoo task duplication at the scale's preset; long)",
    )
    p.add_argument("--threads", type=int, help="torch threads, fixed and recorded")
    p.add_argument(
        "--store", default=DEFAULT_STORE, help="SQLite results file (default: %(default)s)"
    )
    p.add_argument("--fresh", action="store_true", help="measure again instead of resuming")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_executor_args(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from ..reproduce import TASK_PRESETS, run_reformer

    size = "smoke" if args.preset == "smoke" else args.scale
    device = "cuda" if size == "paper" and torch.cuda.is_available() else "cpu"
    if args.threads is not None and args.threads < 1:
        print(f"zoo reproduce: --threads must be >= 1, got {args.threads}", file=sys.stderr)
        return 2
    try:
        executor = executor_from_args(args)
        store = ResultStore(args.store)
    except ZooError as err:
        print(f"zoo reproduce: {err}", file=sys.stderr)
        return 2
    with store, executor:
        print(f"reproducing the Reformer's claims, size {size}, on {device} -> {args.store}")
        if size == "paper" and device == "cpu":
            print("no CUDA device here: the paper-size memory numbers are predicted (meta device)")
        try:
            done = run_reformer(
                size,
                store,
                device=device,
                threads=args.threads,
                fresh=args.fresh,
                progress=not args.no_progress,
                meta={"command": " ".join(["zoo", *sys.argv[1:]])},
                executor=executor,
            )
        except KeyboardInterrupt:
            print(
                "\ninterrupted: every finished case is stored; run the same command again to "
                "measure only the missing ones",
                file=sys.stderr,
            )
            return 130
        for sweep in done.sweeps:
            counts = ", ".join(f"{n} {s}" for s, n in sorted(sweep.counts().items()))
            print(
                f"run {sweep.run_id}: {counts or 'nothing new'}"
                + (f"; {sweep.already_done} already stored" if sweep.already_done else "")
            )
    if size == "smoke" or args.with_table2:
        from ..cli import main as zoo

        task = ["task", "duplication", "--preset", TASK_PRESETS[size], "--store", args.store]
        task += ["--quiet"] if args.no_progress else []
        task += ["--threads", str(args.threads)] if args.threads else []
        task += executor_argv(args)
        print("Table 2 (claim f): zoo " + " ".join(task), flush=True)
        if status := zoo(task):
            return status
    print(render_claims(args.store))
    return 0


def render_claims(path: str) -> str:
    """The claims table of everything stored at `path`, as plain text, rules listed below it."""
    from ..measure.table import format_table
    from ..report.claims import claims_table

    with ResultStore(path, create=False) as store:
        table = claims_table(store.to_dataframe())
    rules = list(dict.fromkeys(r for r in table["ratio_rule"] if r != "-"))
    body = [
        [
            row["claim"],
            row["setting"],
            row["published"],
            row["ours"],
            row["verdict"],
            f"[{rules.index(row['ratio_rule']) + 1}]" if row["ratio_rule"] in rules else "-",
        ]
        for _, row in table.iterrows()
    ]
    text = format_table(["claim", "setting", "published", "ours", "verdict", "rule"], body)
    return (
        "\nThe Reformer's claims, reproduced\n"
        + text
        + "\n\nrules:\n"
        + "\n".join(f"  [{i}] {rule}" for i, rule in enumerate(rules, 1))
    )
