"""The `zoo` command line (also `python -m attention_zoo`). Each subcommand lives in commands/.

`main` is the one boundary for errors: the project's errors (ZooError, raised by the checks that
run before any work) and environment problems end as one line on stderr and exit code 2, with a
traceback only under --debug; Ctrl-C ends with 130 after the command saved what it finished.
"""

from __future__ import annotations

import argparse
import os
import re
import sqlite3
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

from .commands import (
    bench_cmd,
    list_cmd,
    memory_cmd,
    report_cmd,
    reproduce_cmd,
    results_cmd,
    task_cmd,
)
from .errors import UsageError, ZooError, did_you_mean
from .plugins import ENTRY_POINT_GROUP, ENV_VAR, load_plugins_for_command

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

EPILOG = f"""Run 'zoo COMMAND --help' for each command's options and an example.

Plugins: installed packages' '{ENTRY_POINT_GROUP}' entry points, the modules in ${ENV_VAR}
(comma-separated) and --import MODULE (a module name or a .py file; before or after COMMAND)
are loaded first, so the backends, tasks and residual variants they register work in every command.
"""


class ZooArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one line (raised as UsageError, printed by main), with a
    did-you-mean for a misspelled choice."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{_suggest(message)} (see '{self.prog} --help')", prog=self.prog)


def _suggest(message: str) -> str:
    if flag := re.fullmatch(r"argument ([-\w]+)(?:/[-\w]+)*: expected one argument", message):
        # argparse reads a value that starts with '-' (--fits -1GiB) as the next flag
        return f"{message} (a value that starts with '-' is written {flag.group(1)}=VALUE)"
    match = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if not match:
        return message
    choices = [c.strip().strip("'") for c in match.group(2).split(",")]
    return message + did_you_mean(match.group(1), choices)


def add_common_arguments(p: argparse.ArgumentParser, suffix: str = "") -> None:
    """--import and --debug, accepted before the subcommand and after it."""
    g = p.add_argument_group("plugins and errors")
    g.add_argument(
        "--import",
        dest="imports" + suffix,
        action="append",
        metavar="MODULE",
        help="import MODULE first (a module name or a .py file) so that the backends, tasks and "
        f"residual variants it registers are available; repeatable; also ${ENV_VAR}",
    )
    g.add_argument(
        "--debug",
        dest="debug" + suffix,
        action="store_true",
        help="show the full traceback of an error instead of one line",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = ZooArgumentParser(
        prog="zoo",
        description="attention-zoo: compare attention mechanisms on your own hardware.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common_arguments(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS:
        module.add_parser(sub)
        add_common_arguments(sub.choices[name], suffix="_sub")
    return parser


def parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """parse_args, but an unknown flag is named with the closest flag of its subcommand."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        sub = _subparsers(parser).get(getattr(args, "command", None) or "", parser)
        raise UsageError(_unrecognized(sub, extra), prog=sub.prog)
    return args


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _unrecognized(parser: argparse.ArgumentParser, extra: Sequence[str]) -> str:
    flag = next((x.split("=", 1)[0] for x in extra if x.startswith("-")), None)
    if flag is None:
        return f"unrecognized argument(s): {' '.join(extra)} (see '{parser.prog} --help')"
    flags = [s for a in parser._actions for s in a.option_strings if a.help != argparse.SUPPRESS]
    hint = did_you_mean(flag, flags, quote=False)
    return f"unrecognized argument {flag}" + (hint or f" (see '{parser.prog} --help')")


SIGPIPE_EXIT = 141  # a shell's status for a writer whose reader closed the pipe (128 + SIGPIPE)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = "zoo"
    try:
        parser = build_parser()
        args = parse(parser, argv)
        if args.command is None:
            parser.print_help()
            return 2
        prog = f"zoo {args.command}"
        args.argv = argv  # the words after `zoo`, as commands record them (commands/recording.py)
        load_plugins_for_command([*(args.imports or []), *(args.imports_sub or [])])
        return int(args.run(args) or 0)
    except KeyboardInterrupt as exc:
        print(f"{prog}: {str(exc) or 'interrupted'}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader stopped early (`| head`): end quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush error at exit
        return SIGPIPE_EXIT
    except (ZooError, OSError, sqlite3.Error) as err:
        if "--debug" in argv:
            traceback.print_exc()
        prog = getattr(err, "prog", None) or prog
        print(f"{prog}: error: {_one_line(err)}", file=sys.stderr)
        return 2


def _one_line(err: BaseException) -> str:
    if isinstance(err, OSError) and err.strerror:
        text = f"{err.strerror}: {err.filename}" if err.filename else err.strerror
    elif isinstance(err, sqlite3.Error):
        text = f"results store: {err}"
    else:
        text = str(err)
    return " ".join(text.split())
