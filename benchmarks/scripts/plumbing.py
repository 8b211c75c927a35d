"""The gate's plumbing: git, asv's commands and stored results, and one comparison of two
commits run as interleaved asv rounds on their sides (sides.py)."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sides as gate_sides  # sibling script

ROOT = Path(__file__).resolve().parents[2]

# Per round: 5 samples or more, as many as fit in 0.4 s (at most 1,000), after 0.1 s of warm-up
# (a process's first call can take several times the rest; by 0.1 s the calls have settled, and
# the low quantile below leaves a slow straggler out); each sample is one call after a fresh setup
# (the suite's setup hooks). On a shared VM the spread is between processes (each has its own
# level) and over tens of seconds (the machine's speed drifts), far more than within one process's
# window: short rounds, and more of them, interleave the two sides finer for the same time
# (docs/regression.md). Passed to asv for the gate's comparisons only: published results keep
# asv's defaults. The Intel Xeon limits were calibrated with exactly this and TIME_QUANTILE; the
# AMD EPYC ones with the fastest sample of 4 rounds of 1 s.
SAMPLING = {"repeat": "(5,1000,0.4)", "warmup_time": "0.1"}
# The gate's quantile of a time's samples: low, so slow spells that cover most of a side's samples
# still leave it alone, and not the fastest, which one rare fast sample sets.
TIME_QUANTILE = 0.1
# The suite's import-time warm-up (benchmarks/common.py's _warm_up) readies FakeTensorMode for the
# memory and prediction benchmarks; the gate's rounds time steps, so each round's two imports of the
# suite (asv's discovery and its forkserver) skip it. No timed result changes.
ROUND_ENV = {"ZOO_ASV_NO_WARMUP": "1"}
NONE_SELECTED = "No benchmarks selected"  # asv run, when no benchmark of a side matches --bench
GATE_DIR = Path(".asv") / "gate"  # the gate's config, sides and results, apart from published ones


class GateError(Exception):
    """The gate could not decide: exit code 2."""


_START = time.monotonic()


def elapsed() -> float:
    """Seconds since the gate started."""
    return time.monotonic() - _START


def say(message: str) -> None:
    """A line of the gate's own, with the seconds since it started."""
    print(f"gate [{elapsed():6.0f}s]: {message}", flush=True)


# ---- git -------------------------------------------------------------------------------------


def git(
    *args: str, check: bool = True, repo: Path = ROOT, env: dict[str, str] | None = None
) -> str:
    proc = subprocess.run(
        ["git", *args], cwd=repo, capture_output=True, text=True, env={**os.environ, **(env or {})}
    )
    if check and proc.returncode != 0:
        raise GateError(f"git {' '.join(args)} failed: {proc.stderr.strip() or proc.stdout}")
    return proc.stdout.strip()


def commit_of(rev: str) -> str | None:
    out = git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
    return out or None


def short(commit: str) -> str:
    return git("log", "-1", "--format=%h %s", commit)[:72]


@contextlib.contextmanager
def kept(commit: str, name: str) -> Iterator[str]:
    """Keep a scratch commit reachable (a ref under refs/zoo-gate/) while the gate uses it."""
    ref = f"refs/zoo-gate/{name}"
    git("update-ref", ref, commit)
    try:
        yield commit
    finally:
        git("update-ref", "-d", ref, check=False)


@contextlib.contextmanager
def checked_out(commit: str) -> Iterator[Path]:
    """`commit`'s tree in a temporary git worktree."""
    with tempfile.TemporaryDirectory(prefix="zoo-gate-") as tmp:
        tree = Path(tmp) / "tree"
        git("worktree", "add", "--detach", "--quiet", str(tree), commit)
        try:
            yield tree
        finally:
            git("worktree", "remove", "--force", str(tree), check=False)


def snapshot_worktree(repo: Path = ROOT) -> str:
    """A commit of the working tree's tracked files (uncommitted changes included), or HEAD. Taken
    on a private copy of the index: two snapshots at once would otherwise race for index.lock."""
    index = repo / git("rev-parse", "--git-path", "index", repo=repo)
    with tempfile.TemporaryDirectory(prefix="zoo-gate-") as tmp:
        private = shutil.copyfile(index, Path(tmp) / "index") if index.is_file() else index
        made = git("stash", "create", repo=repo, env={"GIT_INDEX_FILE": str(private)})
    return made or git("rev-parse", "HEAD", repo=repo)


def same_tree_commit(commit: str) -> str:
    """A new commit with `commit`'s tree and `commit` as parent: the same code under another hash,
    so that asv measures a commit against itself as two."""
    return git(
        "commit-tree", f"{commit}^{{tree}}", "-p", commit, "-m", "gate calibration: same tree"
    )


# Paths whose changes cannot move a benchmark's time: docs, reports, tests and prose.
NOT_CODE = tuple(f":(top,exclude){p}" for p in ("docs", "reports", "tests", "mkdocs.yml"))
NOT_CODE += (":(top,exclude,glob)**/*.md",)


def is_shallow(repo: Path = ROOT) -> bool:
    """Whether the clone at repo holds only part of its history."""
    return git("rev-parse", "--is-shallow-repository", repo=repo) == "true"


def last_code_change(head: str, repo: Path = ROOT) -> str | None:
    """The latest commit of head's first-parent history, head included, that changed anything
    but NOT_CODE (None: none did, or this clone cannot tell): what a commit changing only those
    leaves to be gated. A shallow clone is deepened first: its oldest commit looks to git as if it
    added every path."""
    if is_shallow(repo):
        git("fetch", "--quiet", "--unshallow", check=False, repo=repo)
    out = git("log", "--first-parent", "-1", "--format=%H", head, "--", ":/", *NOT_CODE, repo=repo)
    shallow = repo / git("rev-parse", "--git-path", "shallow", repo=repo)
    if not out or (shallow.is_file() and out in shallow.read_text().split()):
        return None
    return out


def resolve_base(base: str | None, head: str, missing_base_ok: bool) -> str | None:
    """The base commit: `base`, else the merge base of head and main (head's parent when head is
    on main). None (with a message) when it is not in this clone and missing_base_ok."""
    if base is None:
        main = commit_of("main") or commit_of("origin/main")
        merge_base = git("merge-base", head, main, check=False) if main else ""
        base = merge_base if merge_base and merge_base != head else f"{head}~1"
    found = commit_of(base)
    if found is None and is_shallow():
        git("fetch", "--quiet", "--deepen=1", check=False)  # a shallow clone: fetch one more
        found = commit_of(base)
    if found is None:
        why = (
            f"{base} is not in this clone (first commit, or history not fetched: "
            f"git fetch --unshallow)"
        )
        if missing_base_ok:
            say(f"nothing to compare against: {why}; skipped")
            return None
        raise GateError(why)
    return found


# ---- asv -------------------------------------------------------------------------------------


def load_asv_config(path: Path) -> dict:
    """asv.conf.json as asv reads it (JSON with // comments); GateError when it is not usable."""
    from asv.util import load_json

    try:
        conf = load_json(str(path), api_version=1, js_comments=True)
    except Exception as exc:
        raise GateError(f"{path} is not a valid asv configuration: {exc}") from None
    for key in ("repo", "benchmark_dir", "env_dir", "html_dir", "results_dir"):
        if key not in conf:
            raise GateError(f"{path} has no {key!r}: the gate runs the suite with asv")
    return conf


def derived_config(conf: dict, results_dir: Path, path: Path) -> Path:
    """The project's asv configuration with `results_dir`, written to `path`, for runs in the
    sides' existing environments: asv then needs no branch to exist (it benchmarks what the
    environment holds, filed under --set-commit-hash). asv reads paths relative to the
    configuration file, so they are made absolute."""
    paths = {key: str(ROOT / conf[key]) for key in ("repo", "benchmark_dir", "env_dir", "html_dir")}
    derived = {**conf, **paths, "version": 1, "results_dir": str(results_dir)}
    derived["branches"] = ["HEAD"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(derived, indent=1))
    return path


def asv(
    *args: str,
    echo: bool = True,
    log: Path | None = None,
    env: dict[str, str] | None = None,
    discovered: Path | None = None,
) -> tuple[int, str]:
    """Run an asv command from the repository root (echoing its output, or appending it to
    `log`), with `env` added to this environment; (exit code, output). PYTHONPATH reaches asv
    (it may be where asv is) but not the suite: asv's benchmark processes drop its folders from
    their path, and a side finds its dependencies through its own path file. With `discovered`
    (a benchmarks.json an earlier run of the same code saved), asv reads the suite from it."""
    cmd = [sys.executable, "-m", "asv", *args]
    if discovered is not None:
        cmd[1:3] = [str(Path(__file__).with_name("asv_discovered.py")), str(discovered)]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
    )
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if echo:
            print(line, end="", flush=True)
    out = "".join(lines)
    if log is not None:
        with log.open("a") as f:
            read = f"  # discovery read from {discovered}" if discovered else ""
            f.write(f"$ asv {' '.join(args)}{read}\n{out}\n")
    return proc.wait(), out


def ensure_machine(machine: str) -> None:
    """Record this machine for asv (its CPU, memory, OS) under `machine` if it is not yet."""
    code, out = asv("machine", "--yes", "--machine", machine, echo=False)
    if code != 0:
        raise GateError(f"asv machine failed:\n{out[-2000:]}")


@dataclass(frozen=True)
class Measurement:
    benchmark: str  # asv's name with parameters, as its table prints it
    kind: str  # asv's type: time or track
    unit: str
    base: float | None  # None: failed; nan: n/a (skipped, or no such parameter on that commit)
    head: float | None


def labelled_values(res: object, name: str, low: bool = False) -> dict[str, float | None]:
    """One stored benchmark's values by asv's name with parameters, under the parameters that
    this result was run with (each side discovers its own): asv's value (a time's median), or
    with `low` a time's low quantile of its samples (gate_time)."""
    params = res.get_result_params(name)
    values = res.get_result_value(name, params)
    if low:
        samples = res.get_result_samples(name, params)
        values = [gate_time(v, s) for v, s in zip(values, samples)]
    if not params:
        return {name: values[0]}
    combos = [f"{name}({', '.join(c)})" for c in itertools.product(*params)]
    return dict(zip(combos, values))


def low_quantile(samples: Sequence[float]) -> float:
    """The TIME_QUANTILE of `samples` (a nearest rank, never between two samples)."""
    ordered = sorted(samples)
    return ordered[int(TIME_QUANTILE * (len(ordered) - 1))]


def gate_time(value: float | None, samples: Sequence[float] | None) -> float | None:
    """The gate's time of one benchmark: the low quantile of its samples over every round. A
    shared machine adds time to a step in spells that come and go; a slower kernel raises every
    sample. The fastest sample alone is one rare lucky one, which on some VMs reads identical code
    far apart (docs/regression.md). asv's value (the median) where it kept no samples, or where
    the benchmark failed or was n/a."""
    if value is None or is_na(value) or not samples:
        return value
    return low_quantile(samples)


def load_results(results_dir: Path, machine: str, base: str, head: str) -> list[Measurement]:
    """Every selected benchmark's value on both commits, read from asv's stored results and
    matched by parameter values (never by asv's index of a combination)."""
    from asv.results import iter_results_for_machine_and_hash

    index = results_dir / "benchmarks.json"
    if not index.exists():
        raise GateError("asv stored no benchmark list: discovery failed (see its output above)")
    benchmarks = {k: v for k, v in json.loads(index.read_text()).items() if k != "version"}
    found: dict[str, dict[str, float | None]] = {}
    for commit in (base, head):  # none stored: no selected benchmark exists at that commit
        found[commit] = {}
        for res in iter_results_for_machine_and_hash(str(results_dir), machine, commit):
            for name in res.get_all_result_keys():
                low = benchmarks.get(name, {}).get("type") == "time"
                found[commit].update(labelled_values(res, name, low))
    rows = []
    for label in sorted(found[base].keys() | found[head].keys()):
        bench = benchmarks.get(label.partition("(")[0])
        if bench is None:
            continue
        values = [found[c].get(label, math.nan) for c in (base, head)]
        rows.append(Measurement(label, bench["type"], bench["unit"], *values))
    return rows


def is_na(value: float | None) -> bool:
    return value is not None and math.isnan(value)


# ---- one comparison -------------------------------------------------------------------------


@dataclass
class Comparison:
    rows: list[Measurement]
    log: Path  # asv's output of every round


class Gate:
    """One gate run's configuration and the two sides it measures."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.conf = load_asv_config(args.config)
        self.dir = ROOT / GATE_DIR
        shutil.rmtree(self.dir, ignore_errors=True)  # nothing of an earlier run is ever reused
        self.dir.mkdir(parents=True)
        self.results = self.dir / "results"
        self.conf_path = derived_config(self.conf, self.results, self.dir / "asv.conf.json")
        self.sides: dict[str, gate_sides.Side] = {}
        self.launch: gate_sides.Launch | None = None  # checked on the first side built

    def side(self, commit: str) -> gate_sides.Side:
        """`commit`'s clean environment, built once in this run."""
        if commit not in self.sides:
            folder = self.dir / "sides" / f"{len(self.sides)}-{commit[:8]}"
            say(f"building a clean environment of {short(commit)}")
            try:
                self.sides[commit] = side = gate_sides.build_side(ROOT, commit, folder)
            except gate_sides.SideError as exc:
                raise GateError(str(exc)) from None
            if self.launch is None:
                self.launch = self.launch_on(side)
        return self.sides[commit]

    def launch_on(self, side: gate_sides.Side) -> gate_sides.Launch:
        """asv's forkserver; on CUDA checked first (a fork after the suite's import must reach
        the GPU), else what works, said."""
        if self.args.device == "cpu":
            return gate_sides.Launch()
        launch = gate_sides.launch_for(side, ROOT / self.conf["benchmark_dir"], self.args.device)
        if launch.why:
            say(f"forkserver cannot use {self.args.device} ({launch.why}): {launch}")
        return launch

    def compare(self, base: str, head: str, bench: Sequence[str], rounds: int) -> Comparison:
        """The selected benchmarks on both commits, `rounds` each, interleaved; fresh results."""
        shutil.rmtree(self.results, ignore_errors=True)
        log = self.dir / "asv.log"
        order = gate_sides.interleaved([self.side(base), self.side(head)], rounds)
        env = {**gate_sides.huge_pages_env(), **self.launch.env, **ROUND_ENV}
        for i, side in enumerate(order):
            started = time.monotonic()
            args = gate_sides.round_args(
                side, self.conf_path, self.args.machine, bench, SAMPLING, self.launch
            )
            known = side.folder / "benchmarks.json"  # the side's first discovery, reused
            found = known if known.is_file() else None
            code, out = asv(*args, echo=False, log=log, env=env, discovered=found)
            if "Running" not in out and NONE_SELECTED not in out:
                raise GateError(
                    f"asv run stopped (exit {code}) on {side.commit[:8]}:\n{out[-3000:]}"
                )
            if found is None:
                shutil.copyfile(self.results / "benchmarks.json", known)
            role = "base" if side.commit == base else "head"
            say(
                f"round {i // 2 + 1}/{rounds} of {role} {side.commit[:8]}: "
                f"{time.monotonic() - started:.0f} s"
            )
        rows = load_results(self.results, self.args.machine, base, head)
        return Comparison(rows=rows, log=log)
