"""`zoo list`: the registered attention backends, their capabilities, options and availability."""

from __future__ import annotations

import argparse
import json

from ..attention.spec import default_device, list_backends
from ..measure.table import format_table

EXAMPLE = """examples:
  zoo list                 table of backends, availability on the default device
  zoo list --device cuda   availability if run on CUDA
  zoo list --json          the same as JSON
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "list",
        help="list attention backends",
        description="List the registered attention backends: capabilities, options, availability.",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument(
        "--device",
        default=None,
        help="device to check availability for (default: %(default)s = cuda if present, else cpu)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    device = args.device or default_device()
    rows = [spec.describe(device) for spec in list_backends()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(backends_table(rows))
    return 0


def _flag(value: bool) -> str:
    return "yes" if value else "no"


def backends_table(rows: list[dict]) -> str:
    headers = [
        "backend",
        "causal",
        "shared-qk",
        "exact",
        "deterministic",
        f"available ({rows[0]['device'] if rows else ''})",
        "options",
    ]
    table = []
    for r in rows:
        caps = r["capabilities"]
        options = ", ".join(f"{k}={v!r}" for k, v in r["options"].items()) or "-"
        avail = "yes" if r["available"] else f"no: {r['reason']}"
        table.append(
            [
                r["name"],
                _flag(caps["causal"]),
                _flag(caps["shared_qk"]),
                _flag(caps["exact"]),
                _flag(caps["deterministic"]),
                avail,
                options,
            ]
        )
    descriptions = [f"{r['name']}: {r['description']}" for r in rows]
    return "\n".join([format_table(headers, table), "", *descriptions])
