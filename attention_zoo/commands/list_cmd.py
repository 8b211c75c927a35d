"""`zoo list`: the registered attention backends (capabilities, options, availability, origin),
tasks and residual variants."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from ..argtypes import integer
from ..attention.decode import decoding_of
from ..attention.spec import BACKENDS, default_device
from ..blocks.residual import RESIDUALS
from ..errors import ZooError
from ..measure.fair import FairSetting, fair_numbers
from ..measure.table import format_table
from ..measure.units import format_bytes
from ..registry import Registry
from ..tasks import TASKS
from .parsers import add_command
from .validate import check_device

HELP = "list attention backends, tasks and residual variants, with their origin"
DESCRIPTION = (
    "List the registered attention backends (capabilities, options, availability, "
    "origin), tasks and residual variants."
)
EXAMPLE = """examples:
  zoo list                 table of backends, availability on the default device
  zoo list --device cuda   availability if run on CUDA
  zoo list --json          the backends as JSON (each implementation: why it cannot run there)
  zoo list --import mine   with the backends, tasks and residual variants module `mine` registers

The origin column says where each entry comes from: built-in, an installed plugin (entry point
'attention_zoo.plugins'), ZOO_IMPORT or --import. The fair-comparison columns are computed, not
measured, for one block of 4 heads x 64 (hidden 256) and one sequence of --context positions in
float32: its parameters, its decoding state's bytes (cannot decode: -), and its forward FLOPs per
position (causal where it can be).
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "list", HELP, DESCRIPTION, EXAMPLE)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument(
        "--context",
        type=integer(1),
        default=FairSetting().context,
        help="positions of the sequence the state bytes and FLOPs per token are computed for "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--device",
        "--devices",
        dest="device",
        help="device to check availability for: cpu, cuda, cuda:N or meta "
        "(default: cuda if present, else cpu)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    device = args.device or default_device()
    check_device(device, flag="--device", present=False, allow=("cpu", "cuda", "meta"))
    setting = FairSetting(context=args.context)
    rows = [
        {
            **spec.describe(device),
            "decoding": decoding_of(spec),
            "origin": BACKENDS.origin(spec.name),
            "fair": _fair(spec.name, setting),
        }
        for spec in BACKENDS
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(backends_table(rows))
    print()
    print(_others("tasks", TASKS))
    print(_others("residual variants", RESIDUALS))
    return 0


def _others(what: str, registry: Registry) -> str:
    """'tasks: duplication, associative-recall (built-in); mine (--import my_tasks)'."""
    by_origin: dict[str, list[str]] = {}
    for name in registry.names():
        by_origin.setdefault(registry.origin(name), []).append(name)
    return f"{what}: " + "; ".join(f"{', '.join(n)} ({o})" for o, n in by_origin.items())


def _fair(backend: str, setting: FairSetting) -> dict[str, Any] | None:
    """The backend's fair-comparison numbers with its defaults (None where it cannot be built or
    counted on the meta device, e.g. CUDA-only kernels or an operator with no meta kernel, or needs
    options it has no default for)."""
    try:
        numbers = fair_numbers(backend, {}, setting)
    except (ZooError, TypeError, NotImplementedError):
        return None
    return {**numbers.to_dict(), "setting": dataclasses.asdict(setting)}


def _kernels(kernels: list[dict]) -> str:
    """'cpu-fused*, math, flex-': the implementations, the one auto picks, those that cannot run."""
    return ", ".join(
        k["name"] + ("*" if k["auto"] else "") + ("-" if k["reason"] else "") for k in kernels
    )


def _flag(value: bool) -> str:
    return "yes" if value else "no"


def _fair_cells(fair: dict[str, Any] | None) -> list[str]:
    if fair is None:
        return ["-", "-", "-"]
    state = fair["state_bytes"]
    return [
        f"{fair['params'] / 1e3:.0f}k",
        "-" if state is None else format_bytes(state),
        f"{fair['flops_per_token'] / 1e6:.2f}M",
    ]


def backends_table(rows: list[dict]) -> str:
    fair = next((r["fair"] for r in rows if r.get("fair")), None)
    context = fair["setting"]["context"] if fair else FairSetting().context
    headers = [
        "backend",
        "causal",
        "shared-qk",
        "kind",
        "decodes",
        "deterministic",
        f"available ({rows[0]['device'] if rows else ''})",
        "kernels (* auto, - cannot run here)",
        "params",
        f"state/seq @{context}",
        f"FLOPs/token @{context}",
        "origin",
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
                caps["kind"],  # full (exact), pattern (exact under a fixed mask), approximate
                r["decoding"],  # cached, cached-hf, recompute, none (attention/decode.py)
                _flag(caps["deterministic"]),
                avail,
                _kernels(r["kernels"]),
                *_fair_cells(r["fair"]),
                r["origin"],
                options,
            ]
        )
    descriptions = [f"{r['name']}: {r['description']}" for r in rows]
    return "\n".join([format_table(headers, table), "", *descriptions])
