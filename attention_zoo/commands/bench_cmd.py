"""`zoo bench`: measure a grid of cases (from flags or a TOML preset) into the results store."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from typing import Any

import torch

from ..argtypes import choices, integer, integers, names, number, size
from ..engine import RunInterrupted, RunPolicy, continued_run
from ..errors import Interrupted, UsageError
from ..executors import add_executor_args, executor_from_args
from ..measure.capture import CUDA_GRAPHS, ON, graphs_apply
from ..measure.cases import DECODE_MODES, DECODERS, DTYPES, MODES, BenchCase
from ..measure.labels import DEFAULT_REFERENCE
from ..measure.limits import auto_memory_limit
from ..measure.load import busy_warning, cpu_count, machine_load
from ..measure.metrics import MEASURE_GROUPS
from ..measure.peers import PEERS, get_peer, is_peer
from ..measure.peers import families as peer_families
from ..measure.preflight import TimeCheck, check_any_runs, check_cases, time_check
from ..measure.rate import probes_to_time
from ..measure.runner import MeasureSettings
from ..measure.status import ERROR, INVALID
from ..measure.table import comparison_table, group_cases
from ..measure.timing import CLOCKS, CPU_CLOCK, WALL
from ..measure.trust import busy_threads
from ..measure.units import format_bytes
from ..presets import SweepPreset, builtin_presets, load_sweep_preset
from ..store import DEFAULT_STORE, check_store_path, open_store, preview_store
from ..sweep import AUTO, BenchPlan, SweepGrid, run_sweep
from .parsers import add_command
from .recording import recorded_command
from .run_flags import add_run_args, policy_from_args, run_rule_text
from .validate import check_device, check_reference

HELP = "measure time, memory and FLOPs of a grid of cases"
DESCRIPTION = (
    "Measure time (median, IQR), memory (measured, predicted, cross-checks) "
    "and FLOPs for a grid of backends x lengths x modes, store every metric, print a table."
)
EXAMPLE = """examples:
  zoo bench --preset quick
      every backend through SelfAttention at 256, 512 and 1024 tokens, CPU steps timed by the
      process's CPU time at one thread (a busy machine still ranks them); prints a table
  zoo bench --backends full,sdpa,lsh --lengths 1024,4096 --modes forward,forward+backward \\
            --option lsh.num_hashes=1,4 --threads 2
      a grid from flags; a comma list in --option is an axis (here num_hashes 1 and 4)
  zoo bench --target attention --backends sdpa,local,linear --lengths 1024,4096,16384 \\
            --modes prefill,decode --new-tokens 64 --decoders own,recompute --threads 2
      generation: prefill time, time per generated token and decoding state bytes per context
      length, each backend's own decoding beside recomputing the prefix every token
  zoo bench --preset standard --lengths 8192 --isolate --memory-limit 8GiB
      a preset with one axis overridden, each case in its own process under an 8 GiB limit
  zoo bench --preset standard --resume
      continue the latest interrupted run of the same grid: only missing cases are measured
  zoo bench --preset quick --run-id nightly
      measure into run 'nightly' (continuing it if it exists: its stored cases are skipped)
  zoo bench --preset standard --devices cuda --executor ray --ray-address auto
      one Ray task per case on the cluster this machine joined, one GPU each; rows stream into
      --store on this machine

Results go to --store (default: %(store)s), one row per metric, committed case by case.
A case that fails is stored as 'error', an out-of-memory one as 'oom', one whose output breaks
the contract (shape, dtype, NaN, or an exact backend off its reference) as 'invalid', one
stopped past --timeout as 'timeout', and the sweep goes on; at its end the command exits 1 when
a case ended 'error' or 'invalid' (code that failed; 'oom' and 'timeout' are the machine's
limits). Refused before anything runs, one line each, nothing stored for them: a named kernel
that cannot run a case, and a case predicted past --time-limit or --timeout (its FLOPs at its own
rate here, timed once at 1024 tokens and cached); when every case is refused the command exits 2.
A case this machine cannot run (a CUDA-only backend here, a bidirectional one asked to be causal)
is stored as 'skipped' with its reason; a grid of only such cases exits 2 and stores nothing.
A time whose repeats disagree, or taken while other processes kept the cores busy, is marked
'ok (unstable)' / 'ok (busy)' and left out of time ratios. Ctrl-C stops within seconds, even
inside one long operation; --resume then measures only the missing cases.
Built-in presets: %(presets)s (or a path to a .toml file).

%(rule)s
"""


def _bool_list(text: str) -> list[bool]:
    table = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
    try:
        return [table[x.strip().lower()] for x in text.split(",")]
    except KeyError:
        raise argparse.ArgumentTypeError(f"expected true/false values, got {text!r}") from None


def add_grid_arguments(p: argparse.ArgumentParser) -> None:
    """Grid flags shared by `zoo bench` and `zoo memory`; each overrides the preset's value."""
    g = p.add_argument_group("grid (each flag overrides the preset)")
    g.add_argument("--preset", help="built-in preset name or path to a TOML preset")
    g.add_argument(
        "--target",
        choices=["attention", "block", "model"],
        help="attention core alone, SelfAttention block, or ReformerLM (default: block)",
    )
    g.add_argument(
        "--backends", type=names, help="comma list of registry names (default: all registered)"
    )
    g.add_argument(
        "--peers",
        type=names,
        help="other libraries' attention measured beside ours by the same harness: families "
        f"({', '.join(peer_families())}) or peer names ({', '.join(PEERS.names())}); a family "
        "brings the peers of the backends measured, with their options (target block)",
    )
    g.add_argument(
        "--lengths", type=integers(1), help="comma list of sequence lengths, e.g. 1024,4096"
    )
    g.add_argument("--batch", type=integers(1), help="comma list of batch sizes")
    g.add_argument(
        "--modes",
        type=choices(MODES, "mode"),
        help=f"comma list of {', '.join(MODES)}; prefill and decode measure the attention "
        "core's decoding state (target attention, causal)",
    )
    g.add_argument(
        "--new-tokens",
        type=integer(1),
        help="prefill/decode: tokens generated after each --lengths prompt (default 64); decode "
        "times one token, the median over them",
    )
    g.add_argument(
        "--decoders",
        type=choices(DECODERS, "decoder"),
        help="prefill/decode: own (the backend's decoding state, default), recompute (the "
        "whole prefix again every token), or both",
    )
    g.add_argument(
        "--dtypes", type=choices(DTYPES, "dtype"), help=f"comma list of {', '.join(DTYPES)}"
    )
    g.add_argument(
        "--devices",
        "--device",
        dest="devices",
        type=names,
        help="comma list of cpu, cuda, cuda:N, auto (= cuda if present, else cpu)",
    )
    g.add_argument("--causal", type=_bool_list, help="true, false or true,false (default: true)")
    g.add_argument("--heads", type=integer(1), help="attention heads (default 4)")
    g.add_argument("--head-dim", type=integer(1), help="size of each head (default 64)")
    g.add_argument("--hidden", type=integer(1), help="block/model hidden size (default 256)")
    g.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="BACKEND.NAME=VALUE[,VALUE]",
        help="backend option, repeatable; several values make an axis (lsh.num_hashes=1,4)",
    )


def grid_from_args(
    args: argparse.Namespace, *, devices_present: bool
) -> tuple[SweepGrid, SweepPreset | None]:
    """The preset's grid (or the default one) with every given flag applied on top; its devices
    checked (devices_present: they must exist here, not only be valid names)."""
    preset = load_sweep_preset(args.preset) if args.preset else None
    base = preset.grid if preset else SweepGrid()
    changes: dict[str, Any] = {}
    for flag, name in (
        ("target", "target"),
        ("backends", "backends"),
        ("peers", "peers"),
        ("lengths", "seq_lens"),
        ("batch", "batches"),
        ("modes", "modes"),
        ("dtypes", "dtypes"),
        ("devices", "devices"),
        ("causal", "causal"),
        ("heads", "num_heads"),
        ("head_dim", "head_dim"),
        ("hidden", "hidden"),
        ("new_tokens", "new_tokens"),
        ("decoders", "decoders"),
    ):
        value = getattr(args, flag)
        if value is not None:
            changes[name] = tuple(value) if isinstance(value, list) else value
    if args.option:
        options = {k: dict(v) for k, v in base.options.items()}
        given: dict[tuple[str, str], str] = {}
        for text in args.option:
            backend, name, values = _parse_option(text)
            if (backend, name) in given:  # the last would win silently
                both = ",".join(t.split("=", 1)[1] for t in (given[backend, name], text))
                raise UsageError(
                    f"--option {backend}.{name} is given twice ({given[backend, name]!r}, "
                    f"{text!r}); give its values as one comma list: --option "
                    f"{backend}.{name}={both}"
                )
            given[backend, name] = text
            options.setdefault(backend, {})[name] = values if len(values) > 1 else values[0]
        changes["options"] = options
    grid = dataclasses.replace(base, **changes)
    for flag in ("new_tokens", "decoders"):  # refused where they would change nothing
        if getattr(args, flag) is not None and not set(grid.modes) & set(DECODE_MODES):
            raise UsageError(
                f"--{flag.replace('_', '-')} applies to the prefill and decode modes; add "
                "--modes prefill,decode or drop it"
            )
    for device in grid.devices:
        check_device(
            device, flag="--devices", present=devices_present, allow=("cpu", "cuda", "auto")
        )
    return grid, preset


def check_options_used(args: argparse.Namespace, cases: list[BenchCase]) -> None:
    """Each --option, --peers family and --hidden must change a measured case: one that would
    not (a backend not measured, a family mirroring none of them, a width the core alone does
    not have) is refused, never ignored."""
    for family in set(args.peers or []) & set(peer_families()):
        if not any(is_peer(c.backend) and get_peer(c.backend).family == family for c in cases):
            mirrors = ", ".join(sorted({s.mirrors for s in PEERS if s.family == family}))
            raise UsageError(
                f"--peers {family} would change nothing: its peers mirror {mirrors}, and none is "
                "measured here; add one to --backends, or drop --peers"
            )
    if args.hidden is not None and cases and all(c.target == "attention" for c in cases):
        raise UsageError(
            "--hidden would change nothing: every case here measures the attention core alone, "
            "at --heads x --head-dim (target attention, or a prefill/decode mode); use --target "
            "block or model with a forward mode, or drop --hidden"
        )
    for text in args.option:
        backend, name, _ = _parse_option(text)
        takers = [
            c
            for c in cases
            if c.backend == backend
            or (is_peer(c.backend) and get_peer(c.backend).mirrors == backend)
        ]
        if not any(name in c.options for c in takers):
            measured = ", ".join(sorted({c.backend for c in cases})) or "none"
            raise UsageError(
                f"--option {text} would change nothing: no case measured here runs {backend} "
                f"with options (backends: {measured}); add {backend} to --backends, or drop it"
            )


def _parse_option(text: str) -> tuple[str, str, list[Any]]:
    if "=" not in text or "." not in text.split("=", 1)[0]:
        raise UsageError(
            f"--option {text!r}: write BACKEND.NAME=VALUE, "
            "e.g. lsh.num_hashes=4 or lsh.num_hashes=1,4"
        )
    lhs, rhs = text.split("=", 1)
    backend, name = lhs.split(".", 1)
    values = []
    parts = _split_top(rhs)
    if any(not part.strip() for part in parts):
        raise UsageError(
            f"--option {text!r} has an empty value; give values separated by single commas, "
            f"e.g. {lhs}=1,4"
        )
    for part in parts:
        try:
            values.append(json.loads(part))
        except json.JSONDecodeError:
            values.append(part)  # a bare string, e.g. sdpa.kernel=math
    return backend, name, values


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets: 'a,[1,2]' -> ['a', '[1,2]']."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return [*parts, cur]


def add_parser(sub: argparse._SubParsersAction) -> None:
    epilog = EXAMPLE % {
        "store": DEFAULT_STORE,
        "presets": ", ".join(builtin_presets()),
        "rule": run_rule_text().replace("%", "%%"),
    }
    p = add_command(sub, "bench", HELP, DESCRIPTION, epilog)
    add_grid_arguments(p)
    m = p.add_argument_group("measurement")
    m.add_argument(
        "--budget",
        type=number(minimum=0),
        help="seconds of timed repeats per case after warm-up (0: only --repeats)",
    )
    m.add_argument("--repeats", type=integer(1), help="minimum timed repeats per case (default 3)")
    m.add_argument(
        "--threads",
        type=integer(1),
        help="torch threads, fixed and recorded (default: the preset's, else torch's)",
    )
    m.add_argument(
        "--clock",
        choices=CLOCKS,
        help="what a CPU step is timed by: wall (the wall clock) or cpu (the process's CPU time "
        "at --threads 1: what the step costs, which other processes cannot inflate) (default: "
        "the preset's, else wall)",
    )
    m.add_argument(
        "--interleave",
        action=argparse.BooleanOptionalAction,
        help="time the cases that differ only in backend or options round-robin, so the "
        "machine's load hits them alike and their ratios come from one run (default: the "
        "preset's, else off)",
    )
    m.add_argument(
        "--cuda-graphs",
        choices=CUDA_GRAPHS,
        help="a CUDA step timed as the replay of a CUDA graph, so its time is the kernels' and "
        "not the host's: auto (where the case's kernels and decoding state can be captured; "
        "each case stores whether it was and why not), on (every case, else an error), off "
        "(default: the preset's, else auto)",
    )
    m.add_argument(
        "--metrics",
        type=choices(MEASURE_GROUPS, "metric group"),
        help=f"comma list of groups to measure: {', '.join(MEASURE_GROUPS)}",
    )
    m.add_argument(
        "--memory-limit",
        type=memory_limit,
        default="auto",
        help="CPU guard: a case predicted to need more is stored as oom and not run; with "
        "--isolate also the subprocess's address-space limit. 'auto' = 90%% of the smallest "
        "of available RAM, RLIMIT_AS and the cgroup limit, 'none', or a size like 8GiB "
        "(default: auto)",
    )
    m.add_argument(
        "--time-limit",
        type=time_limit,
        help="a case predicted to take longer (its FLOPs at its rate on this machine, timed "
        "once at 1024 tokens and cached) is refused before the run, in one line, and not "
        "stored: seconds, or 'none' "
        f"(default: the preset's, else {DEFAULT_TIME_LIMIT_S:g})",
    )
    m.add_argument("--isolate", action="store_true", help="run each case in its own subprocess")
    m.add_argument(
        "--timeout",
        type=number(above=0),
        help="seconds a case may run (stored as timeout): it stops after the step that crosses "
        "them, or with --isolate its process is killed then; a case predicted to take longer "
        "is not run",
    )
    s = p.add_argument_group("store and output")
    s.add_argument(
        "--store",
        help=f"SQLite results file; its folder must exist (default: {DEFAULT_STORE}, "
        "folder created)",
    )
    add_run_args(s)
    s.add_argument(
        "--reference",
        help="backend the table's ratios divide by (default: the preset's, else "
        f"{DEFAULT_REFERENCE})",
    )
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_executor_args(p)
    p.set_defaults(run=run)


def settings_from_args(args: argparse.Namespace, preset: SweepPreset | None) -> MeasureSettings:
    base = preset.settings if preset else MeasureSettings()
    changes: dict[str, Any] = {}
    if args.budget is not None:
        changes["time_budget_s"] = args.budget
    if args.repeats is not None:
        changes["min_repeats"] = args.repeats
        changes["max_repeats"] = max(base.max_repeats, args.repeats)
    if args.threads is not None:
        changes["threads"] = args.threads
        if args.threads != 1 and args.clock is None:  # a preset's CPU clock times one thread
            changes["clock"] = WALL
    if args.clock is not None:
        changes["clock"] = args.clock
    if args.metrics is not None:
        changes["metrics"] = tuple(args.metrics)
    if args.cuda_graphs is not None:
        changes["cuda_graphs"] = args.cuda_graphs
    if args.interleave is not None:
        changes["interleave"] = args.interleave
    if args.time_limit is not None:
        changes["time_limit_s"] = None if math.isinf(args.time_limit) else args.time_limit
    elif base.time_limit_s is None:
        changes["time_limit_s"] = DEFAULT_TIME_LIMIT_S
    changes["timeout_s"] = args.timeout
    return dataclasses.replace(base, **changes)


DEFAULT_TIME_LIMIT_S = 300.0  # a few minutes: a longer case is asked for by --time-limit


def time_limit(text: str) -> float:
    """--time-limit: seconds > 0, or infinity for 'none' (no limit)."""
    return math.inf if text == "none" else number(above=0)(text)


def memory_limit(text: str) -> int | str | None:
    """--memory-limit: bytes (a size > 0), None for 'none', or AUTO: 90% of the memory each case
    may use where it runs (available RAM, RLIMIT_AS, cgroup: the smallest), when it starts."""
    if text == "none":
        return None
    if text == "auto":
        return AUTO
    return size(text)


def check_graphs(request: str, cases: list[BenchCase]) -> None:
    """--cuda-graphs on captures CUDA steps: every case must run on CUDA."""
    elsewhere = sorted({c.device for c in cases if not graphs_apply(c.device)})
    if request == ON and elsewhere:
        raise UsageError(
            f"--cuda-graphs on captures CUDA steps, and some cases run on {', '.join(elsewhere)}; "
            "use --devices cuda, or --cuda-graphs auto (captures where it can)"
        )


def _torch_threads() -> int:
    return torch.get_num_threads()


def _describe_limit(limit: int | str | None) -> str:
    if limit == AUTO:
        here = auto_memory_limit()
        where = f": {format_bytes(here.bytes)} here, set by {here.source}" if here else ""
        return f"auto (90% of the smallest of available RAM, RLIMIT_AS and the cgroup limit{where})"
    return format_bytes(limit) if limit else "none"


def _describe_time(settings: MeasureSettings) -> str:
    given = (("--time-limit", settings.time_limit_s), ("--timeout", settings.timeout_s))
    limits = [f"{flag} {value:g} s" for flag, value in given if value is not None]
    if not limits:
        return "no time limit"
    return "time limit per case " + " and ".join(limits) + " (predicted from its FLOPs first)"


def _cpu_timed(warning: str) -> str:
    """A busy-machine warning for a run timed by the process's CPU time: its first sentence (the
    load), then why the times stand."""
    first = warning.split(". ", 1)[0]
    return (
        f"note: {first.removeprefix('warning: ')}; CPU steps are timed by this process's CPU "
        "time at one thread (--clock cpu), which other processes cannot inflate by taking the "
        "core, so they are ranked (shared caches and memory can still slow them a little)"
    )


class _AllRefused(Exception):
    """Every case of the grid was refused before the run (each said so in one line)."""


def _without_refused(
    cases: list[BenchCase], settings: MeasureSettings, *, local: bool
) -> tuple[list[BenchCase], TimeCheck]:
    """The cases left to run once those predicted past the time limit are refused, one line
    each on stderr, before the store is opened, and the check (its predictions are the run's):
    when none is left, _AllRefused (exit 2, nothing stored). The run holds only the cases left,
    so the same command with --resume continues it. On Ray the cases run elsewhere, at a rate
    this machine cannot know: each worker refuses."""
    check = time_check(cases, settings) if local else TimeCheck(refused={}, predicted={})
    left = [c for c in cases if c.key() not in check.refused]
    for line in check.refused.values():
        print(f"zoo bench: {'error: ' if not left else ''}{line}", file=sys.stderr)
    if not left:
        raise _AllRefused
    return left, check


def _dry_run(
    args: argparse.Namespace, cases: list[BenchCase], settings: MeasureSettings, policy: RunPolicy
) -> int:
    """What the run would measure: the cases its time limit keeps, where this machine's rates
    are known (timing probes is the run's work), then the run rule's choice; nothing written."""
    limited = settings.time_limit_s is not None or settings.timeout_s is not None
    local = args.executor == "local"
    untimed = probes_to_time(cases) if limited and local else 0
    try:
        if not untimed:
            cases, _ = _without_refused(cases, settings, local=local)
    except _AllRefused:
        return 2
    with preview_store(args.store) as store:
        run_sweep(cases, store, settings=settings, policy=policy, progress=False)
    if untimed:
        print(
            f"({untimed} rate probe(s) not yet timed on this machine: the run times them first "
            "and refuses any case predicted past the time limit)"
        )
    return 0


def run(args: argparse.Namespace) -> int:
    policy = policy_from_args(args)
    here = args.executor != "ray"  # on a cluster the cases run, and find their devices, elsewhere
    local = args.executor == "local"  # the time check predicts from this process's rates
    grid, preset = grid_from_args(args, devices_present=here)
    settings = settings_from_args(args, preset)
    cases = grid.cases()
    check_options_used(args, cases)
    check_reference(args.reference, [c.backend for c in cases])
    check_graphs(settings.cuda_graphs, cases)
    check_cases(cases, settings.metrics)  # a named kernel that cannot run: refused, not stored
    if here:
        check_any_runs(cases)  # a grid of skipped cases only: refused, not stored
    limit = args.memory_limit  # bytes, None or AUTO, parsed by memory_limit()
    executor = executor_from_args(args)
    reference = args.reference or (preset.reference if preset else None) or DEFAULT_REFERENCE
    if policy.dry_run:
        executor.close()
        return _dry_run(args, cases, settings, policy)
    try:
        check_store_path(args.store, write=True)  # refused before the cases' time predictions
        cases, check = _without_refused(cases, settings, local=local)
        where = executor.describe()  # connects: a bad cluster address fails before the store
        store = open_store(args.store, write=True, resume=policy.resume_required)
    except _AllRefused:
        executor.close()
        return 2
    except BaseException:
        executor.close()
        raise
    # the threads that need free cores (trust.busy_threads): on CUDA only the launching one
    torch_threads = settings.threads or _torch_threads()
    threads = max((busy_threads(c.device, torch_threads) for c in cases), default=torch_threads)
    with store, executor:
        continued_run(store, BenchPlan.kind, [c.key() for c in cases], policy)  # refused early
        print(
            f"{len(cases)} cases -> {store.path}; threads={settings.threads or 'torch default'}, "
            f"memory limit {_describe_limit(limit)}; {_describe_time(settings)}; "
            f"executor {where}",
            file=sys.stderr,
        )
        load_start = machine_load()  # one sample: warned about here, recorded with the run
        # CPU steps timed by the process's CPU time: the load cannot inflate them
        cpu_timed = settings.clock == CPU_CLOCK and all(c.device == "cpu" for c in cases)
        if warning := busy_warning(load_start, cpu_count(), threads):
            print(f"zoo bench: {_cpu_timed(warning) if cpu_timed else warning}", file=sys.stderr)
        try:
            result = run_sweep(
                cases,
                store,
                settings=settings,
                policy=policy,
                isolate=args.isolate,
                memory_limit_bytes=limit,
                timeout_s=args.timeout,
                progress=not args.no_progress,
                meta={
                    "command": recorded_command(args.argv),
                    "preset": preset.source if preset else None,
                },
                executor=executor,
                load_start=load_start,
                predicted=check.predicted,
            )
        except RunInterrupted as stop:
            raise Interrupted(
                f"interrupted: {stop.stored} of {len(cases)} cases are stored in run "
                f"{stop.run_id} (marked interrupted); rerun the same command with --resume "
                f"(or --run-id {stop.run_id}) to measure only the missing ones"
            ) from None
        if result.load_end is not None and (
            warning := busy_warning(result.load_end, cpu_count(), threads, at_end=True)
        ):
            print(f"zoo bench: {_cpu_timed(warning) if cpu_timed else warning}", file=sys.stderr)
        wanted = {c.key() for c in cases}
        rows = [r for r in store.rows(result.run_id) if r["case_key"] in wanted]
        print(comparison_table(group_cases(rows), reference=reference))
        counts = ", ".join(f"{n} {s}" for s, n in sorted(result.counts().items())) or "nothing new"
        print(
            f"\nrun {result.run_id}: {counts}"
            + (f"; {result.already_done} already stored (resumed)" if result.already_done else "")
            + f"; see 'zoo results --store {store.path} --run-id {result.run_id}'"
        )
        failed = sum(result.counts().get(s, 0) for s in (ERROR, INVALID))
    if failed:  # a CI running the sweep must notice code that failed
        print(
            f"zoo bench: {failed} case(s) ended {ERROR} or {INVALID} (their messages: 'zoo "
            f"results --store {store.path} --run-id {result.run_id}'); exit status 1",
            file=sys.stderr,
        )
        return 1
    return 0
