"""Summaries that stay true: a plugin measured with --import ranks in a report built without it
(its capabilities are stored with its rows); no variant is named fastest beside a time set aside;
a missing reference is said in one line by bench, results and report; an unknown one is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pandas")
pytest.importorskip("seaborn")

from attention_zoo.attention.spec import BACKENDS
from attention_zoo.cli import main as zoo_main
from attention_zoo.store import ResultStore

from .report_fixtures import block_case

PLUGIN = '''
"""Attention measured with --import, ranked without it: an approximation (its own kind)."""

from dataclasses import dataclass

from attention_zoo import AttentionCore, Capabilities, register_attention


@dataclass(frozen=True, kw_only=True)
class TruthConfig:
    """No options."""


@register_attention("truth-mine", config=TruthConfig, caps=Capabilities(exact=False))
class TruthAttention(AttentionCore):
    """Attends to the values' mean: cheap, approximate."""

    def attend(self, q, k, v, key_padding_mask):
        return v.mean(-2, keepdim=True).expand_as(v).contiguous()
'''
QUICK = ["--budget", "0", "--repeats", "1", "--threads", "1", "--no-progress"]
GRID = ["--target", "attention", "--lengths", "16,32", "--metrics", "time,memory", *QUICK]


def _summary_rows(folder: Path) -> dict[str, list[str]]:
    """The Summary table's rows by length: [setting, L, fastest exact, fastest not exact, ...]."""
    lines = (folder / "summary.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| setting | L |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return {r[1]: r for r in rows}


@pytest.mark.slow
def test_a_plugin_ranks_in_a_report_built_without_its_import(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    clean_registries: None,
) -> None:
    """Before: without --import its kind was `?` and it dropped out of every ranking."""
    monkeypatch.chdir(tmp_path)
    Path("truth_plugin.py").write_text(PLUGIN)
    store = str(tmp_path / "s.sqlite")
    argv = ["bench", "--import", "truth_plugin.py", "--backends", "truth-mine,full,sdpa"]
    assert zoo_main([*argv, *GRID, "--store", store]) == 0
    BACKENDS.remove("truth-mine")  # a later process, run without --import
    capsys.readouterr()
    assert zoo_main(["results", "--store", store]) == 0
    (line,) = [row for row in capsys.readouterr().out.splitlines() if "truth-mine" in row][:1]
    assert "approximate" in line
    assert zoo_main(["report", "--store", store, "--out", "rep"]) == 0
    rows = _summary_rows(tmp_path / "rep")
    assert sorted(rows) == ["16", "32"]
    for row in rows.values():
        assert row[3].startswith("`truth-mine`") and row[5].startswith("`truth-mine`"), row
    report = (tmp_path / "rep" / "report.md").read_text()
    assert "| `truth-mine` | approximate |" in report and "| `truth-mine` | ? |" not in report


def _store_with_busy_reference(path: Path, *, reference_free: float) -> Path:
    """At L 256: `sdpa` 1 ms, `full` 3 ms, `lsh` 2 ms, times on 2 threads; sdpa's own reading
    leaves `reference_free` cores free (below 1.5: busy, set aside)."""
    with ResultStore(path) as store:
        run = store.start_run(kind="bench", device="cpu")
        for backend, seconds, free in (("sdpa", 1e-3, reference_free), ("full", 3e-3, 2.0),
                                       ("lsh", 2e-3, 2.0)):  # fmt: skip
            rows = [("time_median", seconds, "s"), ("time_iqr", seconds / 50, "s"),
                    ("time_min", seconds, "s"), ("peak_bytes", 1e6, "bytes"),
                    ("free_cores", free, "cores")]  # fmt: skip
            store.add_rows(run, None, block_case(backend, 256).to_dict(), rows)
        store.finish_run(run)
        store._db.execute(
            "UPDATE runs SET load_start = 0, load_end = 0, cpu_count = 2, threads = 2"
        )
        store._db.execute("UPDATE results SET threads = 2")
        store._db.commit()
    return path


@pytest.mark.slow
def test_a_set_aside_reference_leaves_its_class_without_a_fastest(tmp_path: Path) -> None:
    """Before: with every sdpa time set aside as busy, `full` (3x slower) was named fastest."""
    store = _store_with_busy_reference(tmp_path / "s.sqlite", reference_free=0.2)
    assert zoo_main(["report", "--store", str(store), "--out", str(tmp_path / "rep")]) == 0
    row = _summary_rows(tmp_path / "rep")["256"]
    assert row[2] == "not ranked: `sdpa` set aside"  # not `full`
    assert row[3].startswith("`lsh`")  # the other class is still ranked
    summary = (tmp_path / "rep" / "summary.md").read_text()
    assert "fastest `full`" not in summary and "1 taken while the machine was busy" in summary
    idle = _store_with_busy_reference(tmp_path / "idle.sqlite", reference_free=2.0)
    assert zoo_main(["report", "--store", str(idle), "--out", str(tmp_path / "idle")]) == 0
    assert _summary_rows(tmp_path / "idle")["256"][2] == "`sdpa` 1.00x"


@pytest.mark.slow
def test_a_missing_reference_is_said_in_one_line_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: ratio columns of '-' in bench and results, and a summary dividing by sdpa."""
    store = str(tmp_path / "s.sqlite")
    assert zoo_main(["bench", "--backends", "full,lsh", *GRID, "--store", store]) == 0
    said = "no ratios: no sdpa case ran among these (backends: full, lsh); --reference picks"
    assert capsys.readouterr().out.count(said) == 1
    assert zoo_main(["results", "--store", store]) == 0
    assert capsys.readouterr().out.count(said) == 1
    assert zoo_main(["report", "--store", store, "--out", str(tmp_path / "rep")]) == 0
    (note,) = [line for line in capsys.readouterr().err.splitlines() if "note:" in line]
    assert f"note: no sdpa case in {store}, so the report shows no ratios" in note
    assert "No `sdpa` case was measured" in (tmp_path / "rep" / "summary.md").read_text()


def test_an_unknown_reference_is_refused_by_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: `zoo report --reference nosuch` exited 0."""
    store = _store_with_busy_reference(tmp_path / "s.sqlite", reference_free=2.0)
    out = tmp_path / "rep"
    assert zoo_main(["report", "--store", str(store), "--out", str(out), "--reference", "ful"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert "--reference 'ful': no measured variant of that name" in err and "'full'?" in err
    assert not out.exists()
