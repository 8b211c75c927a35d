"""How a `zoo` subcommand's parser is made, and the options several subcommands share."""

from __future__ import annotations

import argparse

from ..store import DEFAULT_STORE


def add_command(
    sub: argparse._SubParsersAction, name: str, summary: str, description: str, epilog: str
) -> argparse.ArgumentParser:
    """The parser of subcommand `name`; its epilog (the examples) keeps its line breaks."""
    return sub.add_parser(
        name,
        help=summary,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def add_store_argument(p: argparse.ArgumentParser, *, optional: bool = False) -> None:
    """--store of a command that reads the results store; optional: None when not given (a
    command that reads other sources too resolves DEFAULT_STORE itself)."""
    p.add_argument(
        "--store",
        default=None if optional else DEFAULT_STORE,
        help=f"SQLite results file (default: {DEFAULT_STORE})",
    )
