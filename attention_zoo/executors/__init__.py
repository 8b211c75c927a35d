"""Where a sweep's cases run: `local` (this process, the default; nothing to install),
`processes` (worker processes on this machine: training runs side by side, timed cases one at
a time) or `ray`
(one Ray task per case on a cluster, or on a Ray runtime started on this machine).

Commands add the same flags with `add_executor_args(parser)`, build the executor with
`executor_from_args(args)` and hold it open with `with executor:` while the run engine
(engine.run_plan: bench sweeps and task trainings alike) uses it; `executor_argv(args)` passes
the same flags on to a command run from inside another.
"""

from __future__ import annotations

import argparse

from ..argtypes import integer, number
from ..errors import UsageError
from ..install import install_hint
from .base import Executor, Job, Outcome, run_job
from .local import LocalExecutor
from .pool import PoolExecutor
from .ray_cluster import RayError, RayExecutor, import_ray

EXECUTORS = ("local", "processes", "ray")
RAY_FLAGS = ("ray_address", "gpus_per_case", "cpus_per_case")
FLAGS = {"processes": ("workers",), "ray": RAY_FLAGS}  # the flags each executor takes


def add_executor_args(parser: argparse.ArgumentParser) -> None:
    """--executor, --ray-address, --gpus-per-case, --cpus-per-case: one group, any command."""
    g = parser.add_argument_group("where the cases run")
    g.add_argument(
        "--executor",
        choices=EXECUTORS,
        default="local",
        help="local: one case after another in this process (default); processes: training "
        "runs side by side in worker processes here (timed cases one at a time after them, so "
        "they do not time each other); ray: one Ray task per case, results streamed into the "
        f"store by this process (needs {install_hint('ray')})",
    )
    g.add_argument(
        "--workers",
        type=integer(1),
        metavar="N",
        help="with --executor processes: worker processes (default: this machine's cores over "
        "--threads, at most one per job); several may share one GPU",
    )
    g.add_argument(
        "--ray-address",
        metavar="ADDRESS",
        help="with --executor ray: 'auto' (the cluster this machine joined with 'ray start'), "
        "'ray://HOST:PORT' or 'HOST:PORT'; default: $RAY_ADDRESS, else a Ray runtime started "
        "on this machine with its CPUs and GPUs",
    )
    g.add_argument(
        "--gpus-per-case",
        type=number(minimum=0),
        metavar="N",
        help="with --executor ray: GPUs each case reserves (default: 1 for a CUDA case, else 0)",
    )
    g.add_argument(
        "--cpus-per-case",
        type=number(minimum=0),
        metavar="N",
        help="with --executor ray: CPUs each case reserves (default: its --threads, else 1)",
    )


def executor_from_args(args: argparse.Namespace) -> Executor:
    """The executor the flags ask for; another executor's flag (--workers without --executor
    processes, a Ray flag without --executor ray), or --executor ray without Ray installed, is
    a one-line error (ZooError) before anything runs."""
    for executor, flags in FLAGS.items():
        given = [f for f in flags if getattr(args, f, None) is not None]
        if given and args.executor != executor:
            flag = "--" + given[0].replace("_", "-")
            raise UsageError(
                f"{flag} applies to --executor {executor}; add --executor {executor} or drop it"
            )
    if args.executor == "local":
        return LocalExecutor()
    if args.executor == "processes":
        return PoolExecutor(workers=args.workers)
    if args.cpus_per_case == 0:
        raise UsageError("--cpus-per-case must be > 0 (a Ray task holds at least part of a CPU)")
    import_ray()
    return RayExecutor(
        address=args.ray_address,
        cpus_per_case=args.cpus_per_case,
        gpus_per_case=args.gpus_per_case,
    )


def executor_argv(args: argparse.Namespace) -> list[str]:
    """The executor flags of `args` as command-line words, for a command run from another."""
    argv = ["--executor", args.executor]
    for flag in FLAGS.get(args.executor, ()):
        value = getattr(args, flag, None)
        if value is not None:
            text = f"{value:g}" if isinstance(value, float) else str(value)
            argv += ["--" + flag.replace("_", "-"), text]
    return argv


__all__ = [
    "EXECUTORS",
    "Executor",
    "Job",
    "LocalExecutor",
    "Outcome",
    "PoolExecutor",
    "RayError",
    "RayExecutor",
    "add_executor_args",
    "executor_argv",
    "executor_from_args",
    "run_job",
]
