"""The regression gate (benchmarks/scripts/gate.py): its verdicts on asv's results, its calibrated
limits, the sides it measures, and end to end on planted regressions in a scratch clone: a slower
local core and a memory increase each exit 1 naming the benchmark, an unchanged commit exits 0, a
backend added on head only is invisible to the base side, a memory increase already in the base
commit is named as such, a broken asv configuration or a crashing baseline check exits 2."""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from attention_zoo.measure import baseline

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "scripts"))
import gate  # noqa: E402  (scripts, importable from their folder)
import judging  # noqa: E402
import limits  # noqa: E402
import plants  # noqa: E402
import plumbing  # noqa: E402
import record  # noqa: E402
import sides  # noqa: E402

NAME = "bench_attention.Time.time_step('cpu', 1, 'attention', 'local', 1024, 'forward')"
TRACKED = "bench_attention.Memory.track_tracked_peak_bytes('cpu', 'attention', 'local', 1024)"
MEASURED = "bench_attention.Memory.track_peak_bytes('cpu', 'attention', 'local', 1024)"


def row(base: float | None, head: float | None, kind: str = "time", unit: str = "seconds"):
    name = {"time": NAME, "bytes": TRACKED}.get(unit if kind == "track" else kind, MEASURED)
    return plumbing.Measurement(name, kind, unit, base, head)


UNIFORM = limits.Limits.uniform(1.3)


def test_time_beyond_its_limit_is_a_regression_naming_numbers_ratio_and_limit() -> None:
    regressions, _, failures = judging.judge([row(0.010, 0.015)], UNIFORM)
    assert len(regressions) == 1 and not failures
    line = regressions[0]
    assert NAME in line and "10.0ms" in line and "15.0ms" in line and "1.50x" in line
    assert "limit 1.30x (--factor)" in line
    assert judging.judge([row(0.010, 0.0125)], UNIFORM) == ([], [], [])
    assert judging.judge([row(0.010, 0.005)], UNIFORM) == ([], [], [])  # faster is no regression


def test_a_flagged_time_names_the_noise_its_limit_was_calibrated_on(tmp_path: Path) -> None:
    path = tmp_path / "time-limits.json"
    written = limits.write({NAME: 1.07}, runs=10, machine="idle-box", commit="abc123", path=path)
    assert written.for_benchmark(NAME).factor == limits.from_noise(1.07) == 1.14
    assert limits.from_noise(1.01) == limits.FLOOR  # never tighter than the floor
    (line,), _, _ = judging.judge([row(0.010, 0.012)], limits.Limits.load(path))
    assert (
        "1.20x > limit 1.14x" in line and "largest 1.070x in 10 unchanged runs on idle-box" in line
    )
    other = "bench_attention.Time.time_step('cpu', 1, 'attention', 'lsh', 1024, 'forward')"
    assert limits.Limits.load(path).for_benchmark(other).source.startswith("not calibrated")
    on_gpu = limits.Limits.load(path).for_benchmark(NAME.replace("'cpu'", "'cuda'"))
    assert on_gpu.source.startswith("uncalibrated")  # CPU's noise says nothing of the GPU's
    # a later calibration of other benchmarks keeps this one's entry
    limits.write({other: 1.10}, runs=5, machine="idle-box", commit="def456", path=path)
    assert limits.Limits.load(path).for_benchmark(NAME).factor == 1.14
    assert limits.Limits.load(path).for_benchmark(other).factor == 1.2
    assert (
        limits.Limits.load(tmp_path / "none.json")
        .for_benchmark(NAME)
        .source.startswith("uncalibrated")
    )


def test_two_sessions_calibrations_combine_into_their_largest_noise_and_summed_runs(
    tmp_path: Path,
) -> None:
    first, second, into = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    other = NAME.replace("'local'", "'lsh'")
    limits.write({NAME: 1.09, other: 1.02}, 3, "vm", "aaa111", first, cpu="Xeon, 2 cores")
    limits.write({NAME: 1.03}, 5, "vm", "aaa111", second, cpu="EPYC, 2 cores")  # another cpu's
    limits.write({NAME: 1.03, other: 1.06}, 6, "vm", "bbb222", second, cpu="Xeon, 2 cores")
    assert limits.main([str(first), str(second), "--into", str(into)]) == 0
    xeon = limits.Limits.load(into, cpu="Xeon, 2 cores")
    assert xeon.entries[NAME]["noise"] == 1.09 and xeon.entries[NAME]["runs"] == 9
    assert xeon.for_benchmark(other).factor == limits.from_noise(1.06) == 1.12
    assert xeon.entries[other]["commit"] == "bbb222"
    assert limits.Limits.load(into, cpu="EPYC, 2 cores").entries[NAME]["runs"] == 5
    limits.main([str(into), str(into), "--into", str(into)])  # one calibration is counted once
    assert limits.Limits.load(into, cpu="Xeon, 2 cores").entries[NAME]["runs"] == 9
    limits.main([str(into), str(first), "--into", str(into)])  # nor one merged in before
    assert limits.Limits.load(into, cpu="Xeon, 2 cores").entries[NAME]["runs"] == 9
    third = tmp_path / "d.json"
    limits.write({NAME: 1.01}, 2, "vm", "ccc333", third, cpu="Xeon, 2 cores")
    limits.main([str(third), str(into), "--into", str(into)])
    assert limits.Limits.load(into, cpu="Xeon, 2 cores").entries[NAME]["runs"] == 11
    fourth, partial = tmp_path / "e.json", tmp_path / "f.json"
    limits.write({NAME: 1.02}, 4, "vm", "ddd444", fourth, cpu="Xeon, 2 cores")
    assert limits.main([str(fourth), str(third), "--into", str(partial)]) == 0  # ccc333 + ddd444
    with pytest.raises(SystemExit) as exit_:  # into holds ccc333 but not ddd444: cannot count
        limits.main([str(into), str(partial), "--into", str(tmp_path / "g.json")])
    assert exit_.value.code == 2 and not (tmp_path / "g.json").exists()


def test_the_gate_says_when_its_limits_were_calibrated_on_another_machine(tmp_path: Path) -> None:
    path = tmp_path / "time-limits.json"
    limits.write({NAME: 1.07}, runs=3, machine="vm", commit="abc", path=path, cpu="Xeon, 2 cores")
    loaded = limits.Limits.load(path)
    assert loaded.calibrated_elsewhere("ci-runner-17", "Xeon, 2 cores") is None  # same processor
    note = loaded.calibrated_elsewhere("laptop", "Ryzen, 16 cores")
    assert note is not None and "calibrated on vm (Xeon, 2 cores), not on this machine" in note
    assert "gate.py --calibrate 3" in note
    assert limits.Limits.uniform(1.3).calibrated_elsewhere("laptop", "Ryzen") is None
    # an entry without its processor (an older calibration) is matched by machine name
    old = {NAME: {"noise": 1.07, "limit": 1.14, "runs": 3, "machine": "vm"}}
    assert limits.Limits(old).calibrated_elsewhere("vm", "any") is None
    assert limits.Limits(old).calibrated_elsewhere("other", "any") is not None


def test_the_gate_runs_the_rounds_its_limits_were_calibrated_with(tmp_path: Path) -> None:
    """A limit is the noise of one sampling: the gate takes its processor's calibrated rounds,
    else DEFAULT_ROUNDS (--factor, none recorded, or mixed); --rounds overrides; two calibrations
    of different rounds do not merge."""
    four, six, none = (tmp_path / f"{n}.json" for n in ("four", "six", "none"))
    limits.write({NAME: 1.03}, runs=3, machine="vm", commit="a", path=four, rounds=4)
    limits.write({NAME: 1.05}, runs=3, machine="vm", commit="b", path=six, rounds=6)
    limits.write({NAME: 1.03}, runs=3, machine="vm", commit="c", path=none)

    def rounds(*argv: str) -> int:
        return gate.parse_args(["--bench", "x", *argv]).rounds

    assert rounds("--limits", str(four)) == 4
    assert rounds("--limits", str(four), "--rounds", "8") == 8
    assert rounds("--limits", str(none)) == rounds("--factor", "1.2") == gate.DEFAULT_ROUNDS
    other = NAME.replace("'local'", "'lsh'")
    limits.write({other: 1.03}, runs=3, machine="vm", commit="d", path=four, rounds=6)
    assert rounds("--limits", str(four)) == gate.DEFAULT_ROUNDS  # mixed: none of them
    with pytest.raises(SystemExit) as exit_:
        limits.main([str(six), str(tmp_path / "none.json"), "--into", str(tmp_path / "m.json")])
    assert exit_.value.code == 2 and not (tmp_path / "m.json").exists()


def test_the_gate_reads_the_limits_of_its_own_processor(tmp_path: Path) -> None:
    """Each processor's calibration is kept beside the others'; a machine reads its own, and one
    never calibrated takes each benchmark's loosest limit and says where they come from."""
    path = tmp_path / "time-limits.json"
    other = NAME.replace("'local'", "'lsh'")
    limits.write({NAME: 1.02, other: 1.20}, runs=3, machine="vm", commit="a", path=path, cpu="A")
    limits.write({NAME: 1.15}, runs=3, machine="vm", commit="b", path=path, cpu="B")
    a, b = limits.Limits.load(path, cpu="A"), limits.Limits.load(path, cpu="B")
    assert a.for_benchmark(NAME).factor == 1.10 and b.for_benchmark(NAME).factor == 1.30
    assert a.for_benchmark(other).factor == 1.40  # calibrated on A
    assert b.for_benchmark(other).source.startswith("not calibrated")  # B's largest: 1.30
    assert b.calibrated_elsewhere("vm", "B") is None
    unknown = limits.Limits.load(path, cpu="C")
    assert [unknown.for_benchmark(n).factor for n in (NAME, other)] == [1.30, 1.40]
    assert "not on this machine (vm, C)" in unknown.calibrated_elsewhere("vm", "C")
    limits.write({NAME: 1.01}, runs=3, machine="vm", commit="c", path=path, cpu="A")
    assert limits.Limits.load(path, cpu="B").for_benchmark(NAME).factor == 1.30  # B's kept


def test_deterministic_tracks_are_exact_and_a_decrease_is_a_note() -> None:
    regressions, _, _ = judging.judge([row(1000, 1020, "track", "bytes")], UNIFORM)
    assert regressions and "1.02x" in regressions[0] and "1,020 bytes" in regressions[0]
    assert TRACKED in regressions[0]
    assert judging.judge([row(1000, 1005, "track", "bytes")], UNIFORM) == ([], [], [])
    regressions, notes, _ = judging.judge([row(1000, 700, "track", "bytes")], UNIFORM)
    assert not regressions and "less than before" in notes[0]
    # the measured peak is not deterministic in the catalogue: shown by asv, not judged
    measured = plumbing.Measurement(MEASURED, "track", "bytes", 1000, 2000)
    assert judging.judge([measured], UNIFORM) == ([], [], [])


def test_failures_and_skips_are_told_apart() -> None:
    _, _, failures = judging.judge([row(0.01, None)], UNIFORM)
    assert failures and "failed on the head commit" in failures[0]
    _, notes, failures = judging.judge([row(None, 0.01)], UNIFORM)
    assert not failures and "base commit only" in notes[0]
    assert judging.judge([row(math.nan, math.nan)], UNIFORM) == ([], [], [])
    _, notes, _ = judging.judge([row(math.nan, 0.01)], UNIFORM)
    assert "one commit only" in notes[0]


def write_results(
    folder: Path,
    commit: str,
    backends: list[str],
    values: list[float],
    samples: list[list[float]] | None = None,
) -> None:
    """asv's stored result of one benchmark over `backends`, as `asv run` files it (`samples`:
    each value's own, default the value alone)."""
    from asv.results import Results
    from asv.runner import BenchmarkResult

    name = "bench_attention.Time.time_step"
    (folder / "benchmarks.json").write_text(
        json.dumps({name: {"name": name, "type": "time", "unit": "seconds"}, "version": 2})
    )
    (folder / "m").mkdir(exist_ok=True)
    (folder / "m" / "machine.json").write_text(json.dumps({"machine": "m", "version": 1}))
    res = Results({"machine": "m"}, {}, commit, 0, "3.11", f"env-{commit[:4]}", {})
    res.add_result(
        {"name": name, "params": [["'cpu'"], [f"'{b}'" for b in backends]], "version": "1"},
        BenchmarkResult(
            result=values,
            samples=samples or [[v] for v in values],
            number=[1] * len(values),
            errcode=0,
            stderr="",
            profile=None,
        ),
        record_samples=True,  # as the gate's rounds do (--append-samples)
    )
    res.save(str(folder))


def test_results_are_matched_by_parameter_values_not_by_asvs_index(tmp_path: Path) -> None:
    """Each side discovers its own parameters: a backend only head has shifts every later index
    on head; the gate still compares lsh with lsh, and the new one is on one commit only."""
    base, head = "a" * 40, "b" * 40
    write_results(tmp_path, base, ["local", "lsh"], [1.0, 5.0])
    write_results(tmp_path, head, ["local", "probe", "lsh"], [1.1, 1.2, 5.5])
    rows = {
        m.benchmark.split(", ")[1][1:-2]: m
        for m in plumbing.load_results(tmp_path, "m", base, head)
    }
    assert (rows["local"].base, rows["local"].head) == (1.0, 1.1)
    assert (rows["lsh"].base, rows["lsh"].head) == (5.0, 5.5)
    assert math.isnan(rows["probe"].base) and rows["probe"].head == 1.2
    _, notes, _ = judging.judge(list(rows.values()), UNIFORM)
    assert notes == [f"{rows['probe'].benchmark}: runs on one commit only, not compared"]


def test_a_time_is_a_low_quantile_of_all_rounds_samples(tmp_path: Path) -> None:
    """A slow spell that moved head's median (asv's value) past the limit moves neither side's
    low quantile; nor does one rare fast sample of base's, which set its fastest sample 0.6x
    apart from head's: the gate compares those quantiles."""
    base, head = "a" * 40, "b" * 40
    write_results(tmp_path, base, ["local"], [1.0], samples=[[0.6] + [1.0] * 19])
    write_results(tmp_path, head, ["local"], [1.35], samples=[[1.0] * 10 + [1.7] * 10])
    (row,) = plumbing.load_results(tmp_path, "m", base, head)
    # past the 1.3x limit: the medians (1.0 and 1.35), and the fastest samples (0.6 and 1.0)
    assert (row.base, row.head) == (1.0, 1.0)
    assert judging.judge([row], UNIFORM) == ([], [], [])
    # a slower kernel raises every sample, and with them the quantile
    assert plumbing.gate_time(1.0, [0.6] + [1.4] * 19) == 1.4
    assert plumbing.gate_time(None, None) is None  # failed: stays failed
    assert math.isnan(plumbing.gate_time(math.nan, None))  # n/a
    assert plumbing.gate_time(2.0, None) == 2.0  # stored without samples: asv's value


def difference(key: str, actual: float, stored: float = 1000) -> dict:
    return {
        "key": key,
        "metric": "tracked_peak_bytes",
        "tolerance": 0.0,
        "actual": actual,
        "increase": actual > stored,
        "message": f"case {key}: tracked_peak_bytes: {actual:,} now vs {stored:,}",
    }


def test_a_baseline_difference_is_blamed_on_the_commit_that_made_it() -> None:
    base = plumbing.commit_of("HEAD")
    head_diffs = [difference("new", 2000), difference("old", 2000), difference("worse", 3000)]
    base_diffs = [difference("old", 2000), difference("worse", 2000)]
    regressions, notes = judging.attribute(head_diffs, base_diffs, base)
    assert regressions[0].startswith("baseline case new:")  # base matches the stored value
    assert "already in base" not in regressions[0]
    assert "case worse" in regressions[1] and "1.500x of base" in regressions[1]
    (note,) = notes
    assert note.startswith("baseline case old:") and f"already in base {base[:7]}" in note
    # the base could not be checked: head keeps the blame
    regressions, notes = judging.attribute(head_diffs, None, base)
    assert len(regressions) == 3 and not notes


def test_the_comment_holds_the_verdict_and_the_report_summary(tmp_path: Path) -> None:
    summary = tmp_path / "summary.md"
    summary.write_text("# attention-zoo comparison\n\n## Summary\n\n3 settings\n")
    comment = tmp_path / "gate.md"
    args = gate.parse_args(["--comment", str(comment), "--report-summary", str(summary)])
    gate.write_comment(args, "REGRESSION (1)", ["time x: 1.00 -> 2.00 (2.00x)"], ["a note"])
    text = comment.read_text()
    assert text.startswith("**Regression gate: REGRESSION (1)**\n\n- time x: 1.00 -> 2.00")
    assert "- a note" in text and text.endswith("## Summary\n\n3 settings\n")
    with pytest.raises(SystemExit):  # a summary needs a comment to go into
        gate.parse_args(["--report-summary", str(summary)])


@pytest.mark.parametrize("device", gate.DEVICES)
def test_the_fast_subset_selects_cores_and_one_block_of_its_device(device: str) -> None:
    time = "bench_attention.Time.time_step"
    names = [
        NAME,
        f"{time}('cpu', 1, 'attention', 'shared-qk', 1024, 'forward+backward')",
        "bench_blocks.ResidualLayers.time_train_step('cpu', 1, 'reversible', 2)",
    ]
    others = [
        f"{time}('cpu', 1, 'block', 'local', 1024, 'forward')",
        f"{time}('cpu', 1, 'attention', 'local', 4096, 'forward')",
    ]
    other_device = next(d for d in gate.DEVICES if d != device)
    mine = [n.replace("'cpu'", f"'{device}'") for n in names]
    theirs = [n.replace("'cpu'", f"'{other_device}'") for n in names]
    bench = gate.parse_args(["--fast", "--device", device]).bench
    assert all(any(re.search(r, n) for r in bench) for n in mine)
    assert not any(re.search(r, n) for r in bench for n in [*others, *theirs])


class FakeGate:
    """Gate.compare answering from a list of row sets, one per comparison."""

    def __init__(self, *answers: list[plumbing.Measurement]) -> None:
        self.args = gate.parse_args(["--bench", "x"])
        self.answers, self.asked = list(answers), []

    def compare(self, base: str, head: str, bench: list[str], rounds: int) -> plumbing.Comparison:
        self.asked.append((bench, rounds))
        return plumbing.Comparison(rows=self.answers.pop(0), log=Path("asv.log"))


@pytest.mark.parametrize("second", [None, "missing"])
def test_a_re_measure_without_a_result_cannot_clear_a_flagged_time(monkeypatch, second) -> None:
    """Over its limit, then no number (head failed, or no row at all): undecided (a failure,
    exit 2), never 'noise, not a regression'."""
    monkeypatch.setattr(judging, "ensure_machine", lambda machine: None)
    again = [] if second == "missing" else [row(0.010, None)]
    verdict = judging.time_verdict(
        FakeGate([row(0.010, 0.015)], again), "a" * 40, "b" * 40, UNIFORM
    )
    assert not verdict.notes and any("re-measure gave no result" in f for f in verdict.failures)


@pytest.mark.parametrize("second", [0.0104, 0.015])
def test_a_time_over_its_limit_is_re_measured_before_it_counts(monkeypatch, second) -> None:
    monkeypatch.setattr(judging, "ensure_machine", lambda machine: None)
    fake = FakeGate([row(0.010, 0.015)], [row(0.010, second)])
    verdict = judging.time_verdict(fake, "a" * 40, "b" * 40, UNIFORM)
    assert fake.asked[1] == ([f"^{re.escape(NAME)}$"], 2 * fake.args.rounds)
    assert verdict.remeasured == {NAME: pytest.approx(second / 0.010)}
    if second > 0.013:  # over the limit again: a regression, with both ratios
        assert len(verdict.regressions) == 1 and "re-measured: 1.50x" in verdict.regressions[0]
    else:
        assert not verdict.regressions
        assert verdict.notes == [f"{NAME}: 1.50x, re-measured 1.04x: noise, not a regression"]


def test_rounds_are_interleaved_abab_then_baba() -> None:
    a, b = sides.Side("a" * 40, Path("a")), sides.Side("b" * 40, Path("b"))
    assert sides.interleaved([a, b], 4) == [a, b, a, b, b, a, b, a]


def test_a_commit_changing_only_docs_tests_or_prose_leaves_the_code_before_it_to_gate(
    tmp_path: Path,
) -> None:
    def commit(path: str) -> str:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(f"{path}\n", encoding="utf-8")
        sh("git", "add", path, cwd=tmp_path)
        sh("git", "commit", "--quiet", "-m", path, cwd=tmp_path)
        return sh("git", "rev-parse", "HEAD", cwd=tmp_path).strip()

    sh("git", "init", "--quiet", cwd=tmp_path)
    sh("git", "config", "user.email", "gate@test", cwd=tmp_path)
    sh("git", "config", "user.name", "gate test", cwd=tmp_path)
    code = commit("attention_zoo/core.py")
    for prose in ("README.md", "docs/index.md", "tests/test_core.py", "reports/run/notes.md"):
        commit(prose)
        assert plumbing.last_code_change("HEAD", repo=tmp_path) == code
    for path in ("benchmarks/bench.py", "pyproject.toml", "asv.conf.json"):
        changed = commit(path)
        assert plumbing.last_code_change("HEAD", repo=tmp_path) == changed
    commit("docs/more.md")
    # a shallow clone's oldest commit looks as if it added every path: deepened, not taken
    shallow = tmp_path.parent / f"{tmp_path.name}-shallow"
    sh("git", "clone", "--quiet", "--depth", "1", f"file://{tmp_path}", str(shallow), cwd=tmp_path)
    assert plumbing.last_code_change("HEAD", repo=shallow) == changed
    cut_off = tmp_path.parent / f"{tmp_path.name}-cut-off"  # shallow, with nowhere to deepen from
    sh("git", "clone", "--quiet", "--depth", "1", f"file://{tmp_path}", str(cut_off), cwd=tmp_path)
    sh("git", "remote", "remove", "origin", cwd=cut_off)
    assert plumbing.last_code_change("HEAD", repo=cut_off) is None


def test_before_code_change_chooses_the_base_so_base_cannot_be_given_too(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        gate.parse_args(["--before-code-change", "--base", "HEAD~1"])
    assert exit_.value.code == 2
    assert "not both" in capsys.readouterr().err


def test_a_memory_decrease_asks_for_a_look_instead_of_calling_it_an_improvement() -> None:
    (less,) = baseline.compare({"tracked_peak_bytes": 1000}, {"tracked_peak_bytes": 800})
    assert not less.increase and "LESS" in less.message() and "Look" in less.message()
    assert "improvement" not in less.message()
    (more,) = baseline.compare({"tracked_peak_bytes": 1000}, {"tracked_peak_bytes": 1200})
    assert more.increase and "1.200x" in more.message() and "1,200" in more.message()


def test_the_cuda_record_says_what_it_would_run(capsys: pytest.CaptureFixture) -> None:
    assert record.main(["--device", "cuda", "--dry-run", "--machine", "gpu-box"]) == 0
    out = capsys.readouterr().out
    assert "--environment existing:" in out and "--set-commit-hash" in out
    assert "reports/asv-results/gpu-box" in out
    (run,) = [line for line in out.splitlines() if "would run: asv run" in line]
    words = shlex.split(run.partition("would run: ")[2])
    regexes = [words[i + 1] for i, word in enumerate(words) if word == "--bench"]
    fwd_bwd = "'forward+backward')"
    wanted = [
        f"bench_attention.Time.time_step('cuda', 1, 'block', 'lsh', 4096, {fwd_bwd}",
        f"bench_attention.Memory.track_peak_bytes('cuda', 'block', 'sdpa', 1024, {fwd_bwd}",
    ]
    assert all(any(re.search(r, n) for r in regexes) for n in wanted)
    assert not any(re.search(r, n.replace("cuda", "cpu")) for r in regexes for n in wanted)


# ---- end to end on a scratch clone -----------------------------------------------------------


def sh(*args: str, cwd: Path) -> str:
    return subprocess.run(args, cwd=cwd, check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clone of this checkout's working tree (its tracked files as they are, uncommitted
    changes included: the gate under test is the one in this tree), committed and tagged
    `gate-start`, on a scratch branch; commits go there only, each on top of `gate-start`, so
    that no test sees another's planted change."""
    path = tmp_path_factory.mktemp("gate") / "repo"
    snapshot = plumbing.snapshot_worktree(ROOT)  # one per xdist worker, on its own index copy
    ref = f"refs/zoo-test/gate-start-{os.getpid()}-{path.parent.name}"  # one per xdist worker
    sh("git", "update-ref", ref, snapshot, cwd=ROOT)
    try:
        sh("git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(path), cwd=ROOT)
        sh("git", "fetch", "--quiet", "origin", ref, cwd=path)
    finally:
        sh("git", "update-ref", "-d", ref, cwd=ROOT)
    sh("git", "checkout", "--quiet", "-B", "scratch", "FETCH_HEAD", cwd=path)
    sh("git", "config", "user.email", "gate@test", cwd=path)
    sh("git", "config", "user.name", "gate test", cwd=path)
    sh("git", "tag", "--force", "gate-start", cwd=path)
    return path


def commit_change(clone: Path, message: str, appended: str = "", on: str = "gate-start") -> None:
    """One commit on top of `on` (its HEAD~1), appending `appended` to local.py."""
    sh("git", "checkout", "--quiet", "--force", "-B", "scratch", on, cwd=clone)
    if appended:
        plants.plant(clone, appended)
    sh("git", "commit", "--quiet", "--allow-empty", "-am", message, cwd=clone)


def run_gate(clone: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "benchmarks/scripts/gate.py", *args],
        cwd=clone,
        capture_output=True,
        text=True,
    )


LOCAL_FORWARD = gate.core_time_regex(["local"]).replace(r"(\+backward)?", "")


@pytest.mark.long
@pytest.mark.slow
def test_each_side_sees_its_own_commits_code_only(clone: Path, tmp_path: Path) -> None:
    """A backend planted on head only: head's environment has it, the base's does not, although
    this process (and the checkout the gate runs from) has head's code."""
    commit_change(clone, "planted head-only backend", plants.head_only_backend("planted"))
    listed = "import attention_zoo.attention as a; print(','.join(a.BACKENDS.names()))"
    base = sides.build_side(
        clone, sh("git", "rev-parse", "HEAD~1", cwd=clone).strip(), tmp_path / "b"
    )
    head = sides.build_side(
        clone, sh("git", "rev-parse", "HEAD", cwd=clone).strip(), tmp_path / "h"
    )
    assert "planted" in head.run_python(listed).strip().split(",")
    assert "planted" not in base.run_python(listed).strip().split(",")
    with pytest.raises(sides.SideError, match="always built fresh"):
        sides.build_side(clone, head.commit, head.folder)


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.alone
def test_gate_passes_an_unchanged_core_and_compares_only_what_both_sides_have(clone: Path) -> None:
    """Head adds a backend the base lacks and leaves local as it is: local (listed before the new
    one, so its parameter index is the same on both sides) passes, the new one's times are on
    one commit only: each side's later rounds reuse its own first discovery, not the other's.
    The exit-0 path at a 1.3x limit: this runs on shared machines; how close an unchanged
    commit reads (1.05x) is the acceptance runs' question, on an idle one."""
    commit_change(clone, "planted head-only backend", plants.head_only_backend("planted"))
    regex = gate.core_time_regex(["local", "planted"]).replace(r"(\+backward)?", "")
    argv = ["--base", "HEAD~1", "--bench", regex, "--no-baselines", "--rounds", "2"]
    proc = run_gate(clone, *argv, "--factor", "1.3")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "gate: no regression" in proc.stdout
    planted = NAME.replace("'local'", "'planted'")
    assert f"note: {planted}: runs on one commit only, not compared" in proc.stdout
    assert re.search(rf"\d\.\d\dx  {re.escape(NAME)}", proc.stdout)
    asv_log = (clone / plumbing.GATE_DIR / "asv.log").read_text()
    assert asv_log.count("Discovering benchmarks") == 2  # once a side, not once a round
    base, head = sorted((clone / plumbing.GATE_DIR / "sides").glob("*/benchmarks.json"))
    for side, has_planted in ((base, False), (head, True)):
        backends = json.loads(side.read_text())["bench_attention.Time.time_step"]["params"][3]
        assert ("'planted'" in backends) == has_planted and "'local'" in backends


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.alone
def test_gate_fails_a_planted_slowdown_naming_the_benchmark(clone: Path) -> None:
    """A 2x slower local core, one comparison of two rounds (re-measuring: test above), flagged
    over its calibrated limit (at most 1.3x) with room for two rounds' noise on a shared machine;
    how small a slowdown the gate catches is the acceptance runs' question."""
    commit_change(clone, "planted slowdown", plants.slower(2.0))
    argv = ["--base", "HEAD~1", "--bench", LOCAL_FORWARD, "--no-baselines", "--no-confirm"]
    proc = run_gate(clone, *argv, "--rounds", "2")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"time {NAME}" in proc.stdout and "> limit" in proc.stdout
    assert "before" in proc.stdout and "after" in proc.stdout


def local_quick_case() -> tuple[baseline.BenchCase, dict]:
    (case,) = [c for c in baseline.quick_cases() if c.backend == "local"]
    return case, baseline.load()["cases"][case.key()]


@pytest.mark.slow
@pytest.mark.long
def test_gate_fails_a_planted_memory_increase_naming_the_case(clone: Path) -> None:
    case, entry = local_quick_case()
    commit_change(clone, "planted memory", plants.hungrier(entry["tracked_peak_bytes"] // 5))
    proc = run_gate(clone, "--base", "HEAD~1", "--fast", "--no-time")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"baseline {case.name()}: tracked_peak_bytes" in proc.stdout
    assert "1.200x" in proc.stdout or "1.199x" in proc.stdout
    assert "already in base" not in proc.stdout


@pytest.mark.slow
@pytest.mark.long
def test_gate_says_a_memory_increase_is_already_in_base(clone: Path) -> None:
    """The increase landed in the base commit: head, an unrelated commit on top, passes and the
    gate names the base as where the baseline difference already is."""
    case, entry = local_quick_case()
    commit_change(clone, "planted memory", plants.hungrier(entry["tracked_peak_bytes"] // 5))
    sh("git", "tag", "--force", "gate-regressed", cwd=clone)
    commit_change(clone, "unrelated", on="gate-regressed")
    proc = run_gate(clone, "--base", "HEAD~1", "--fast", "--no-time")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"baseline {case.name()}: tracked_peak_bytes" in proc.stdout
    assert "already in base" in proc.stdout and "planted memory" in proc.stdout


@pytest.mark.slow
def test_gate_exits_2_showing_the_error_when_the_baseline_check_crashes(clone: Path) -> None:
    commit_change(clone, "planted crash", '\nraise RuntimeError("planted: local is broken")\n')
    proc = run_gate(clone, "--base", "HEAD~1", "--fast", "--no-time")
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "the baseline check failed" in proc.stderr
    assert "RuntimeError: planted: local is broken" in proc.stderr


@pytest.mark.slow
def test_gate_exits_2_on_a_broken_configuration_or_revision(clone: Path) -> None:
    commit_change(clone, "no change")
    config = clone / "asv.conf.json"
    saved = config.read_text()
    try:
        config.write_text(saved.replace('"benchmark_dir"', '"benchmark_dir" "broken"'))
        proc = run_gate(clone, "--base", "HEAD~1", "--bench", LOCAL_FORWARD)
        assert proc.returncode == 2 and "not a valid asv configuration" in proc.stderr
        config.write_text(json.dumps({"version": 1, "repo": "."}))
        proc = run_gate(clone, "--base", "HEAD~1", "--bench", LOCAL_FORWARD)
        assert proc.returncode == 2 and "has no 'benchmark_dir'" in proc.stderr
    finally:
        config.write_text(saved)
    proc = run_gate(clone, "--base", "no-such-revision", "--bench", LOCAL_FORWARD)
    assert proc.returncode == 2 and "no-such-revision" in proc.stderr


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.alone
def test_record_stores_results_under_the_machine(clone: Path, tmp_path: Path) -> None:
    """The record command's whole path on CPU (the CUDA run differs only in its subset): a clean
    environment of HEAD, the fork check, asv run, results filed under the machine. The checkout
    is on PYTHONPATH, as the GPU check runs it."""
    commit_change(clone, "no change")
    results = tmp_path / "asv-results"
    argv = ["--device", "cpu", "--machine", "box", "--results-dir", str(results)]
    proc = subprocess.run(
        [sys.executable, "benchmarks/scripts/record.py", *argv, "--bench", LOCAL_FORWARD],
        cwd=clone,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(clone)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "record: 1 result(s), 0 failed" in proc.stdout
    assert "launch method forkserver" in proc.stdout
    head = sh("git", "rev-parse", "HEAD", cwd=clone).strip()
    assert list((results / "box").glob(f"{head[:8]}-*.json"))


@pytest.mark.slow
@pytest.mark.long
def test_calibrate_writes_each_compared_benchmarks_noise_and_limit(
    clone: Path, tmp_path: Path
) -> None:
    """--calibrate's whole path, at one run of one benchmark: head against a copy of itself, and
    that benchmark's noise, the limit drawn from it and the commit written to --limits only."""
    commit_change(clone, "no change")
    head = sh("git", "rev-parse", "HEAD", cwd=clone).strip()
    limits_file = tmp_path / "limits.json"
    argv = ["--bench", LOCAL_FORWARD, "--rounds", "2", "--limits", str(limits_file)]
    proc = run_gate(clone, "--calibrate", "1", *argv)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    processors = json.loads(limits_file.read_text())["processors"]
    assert set(processors) == {limits.this_cpu()}  # written under the processor it ran on
    written = processors[limits.this_cpu()]
    assert set(written) == {NAME}
    entry = written[NAME]
    assert entry["limit"] == limits.from_noise(entry["noise"]) and entry["runs"] == 1
    assert entry["commit"] == head[:12] and entry["rounds"] == 2
    assert sh("git", "diff", "--stat", cwd=clone).strip() == ""  # the committed limits untouched


@pytest.mark.slow
@pytest.mark.long
def test_publish_writes_the_history_of_the_committed_results(clone: Path) -> None:
    """publish.py as docs/regression.md prints it, run in the clone (it rewrites reports/asv/
    from reports/asv-results/): the history's page is written."""
    page = clone / "reports" / "asv" / "index.html"
    page.unlink(missing_ok=True)
    proc = subprocess.run(
        [sys.executable, "benchmarks/scripts/publish.py"],
        cwd=clone,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(clone)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert page.is_file() and "publish: wrote" in proc.stdout


def test_a_damaged_limits_file_is_could_not_decide_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "limits.json"
    for text in ("{}", "not json", '{"processors": {"other cpu": "no table"}}'):
        bad.write_text(text)
        run = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "scripts" / "gate.py"), "--limits",
             str(bad), "--no-time"],
            capture_output=True, text=True, cwd=ROOT,
        )  # fmt: skip
        assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
        assert "is not a time-limits file" in run.stderr


def test_the_comment_is_written_when_the_gate_cannot_decide(tmp_path: Path) -> None:
    comment = tmp_path / "gate.md"
    argv = ["--head", "no-such-revision", "--comment", str(comment), "--no-time"]
    assert gate.main(argv) == gate.ERROR
    text = comment.read_text()
    assert text.startswith("**Regression gate: could not decide**") and "no-such-revision" in text


def test_a_ratio_metric_keeps_its_digits_in_a_regression_line() -> None:
    assert judging.fmt(0.0123, "ratio") == "0.0123 ratio"
    assert judging.fmt(1234567.0, "bytes") == "1,234,567 bytes"
