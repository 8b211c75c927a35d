"""The `zoo` command line (also `python -m attention_zoo`). Each subcommand lives in commands/."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .commands import (
    bench_cmd,
    list_cmd,
    memory_cmd,
    report_cmd,
    reproduce_cmd,
    results_cmd,
    task_cmd,
)

# (name, module): each module has `add_parser(subparsers)` and `run(args) -> int`.
COMMANDS = [
    ("list", list_cmd),
    ("task", task_cmd),
    ("bench", bench_cmd),
    ("memory", memory_cmd),
    ("results", results_cmd),
    ("report", report_cmd),
    ("reproduce", reproduce_cmd),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zoo",
        description="attention-zoo: compare attention mechanisms on your own hardware.",
        epilog="Run 'zoo COMMAND --help' for each command's options and an example.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for _, module in COMMANDS:
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
