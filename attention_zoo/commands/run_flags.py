"""--run-id, --resume, --force and --dry-run: one meaning on every command that runs jobs
(engine.RUN_RULE)."""

from __future__ import annotations

import argparse
import re
import textwrap
from dataclasses import replace

from ..engine import RUN_RULE, RunPolicy


def add_run_args(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    *,
    force_aliases: tuple[str, ...] = (),
) -> None:
    """The four flags, with the same help everywhere; force_aliases: older names of --force
    that keep working (e.g. "--fresh")."""
    parser.add_argument(
        "--run-id",
        metavar="ID",
        type=_run_name,
        help="name of the run; an existing one is continued (the jobs it holds are not run again)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the latest run of the same jobs (an interrupted one): only the missing "
        "jobs run",
    )
    parser.add_argument(
        "--force",
        *force_aliases,
        dest="force",
        action="store_true",
        help="run every job again, also those the store holds",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the jobs the rule above would run (and how many the store already holds) and "
        "exit: flags, names, presets and the store are checked; nothing runs, nothing is written",
    )


def run_rule_text() -> str:
    """RUN_RULE for an epilog, wrapped to the width of the examples."""
    return "\n".join(textwrap.wrap(RUN_RULE, width=96))


def policy_from_args(args: argparse.Namespace, *, default: RunPolicy | None = None) -> RunPolicy:
    """The run policy the flags ask for (none given: `default`, else RunPolicy()); conflicting
    flags are a one-line UsageError. --resume where the command does not resume by default
    requires a run to continue (engine.run_plan refuses to start a new one in its name)."""
    policy = RunPolicy(run_id=args.run_id, resume=args.resume, force=args.force)
    if default is not None and policy == RunPolicy():
        policy = default
    else:
        policy = replace(policy, resume_required=args.resume and default is None)
    return replace(policy, dry_run=args.dry_run)


def _run_name(text: str) -> str:
    """A run's name: letters, digits and . _ - : + (it names folders and goes into commands)."""
    if not re.fullmatch(r"[\w.:+-]+", text):
        raise argparse.ArgumentTypeError(
            f"a run name is letters, digits and . _ - : + (e.g. 20261130-baseline), got {text!r}"
        )
    return text
