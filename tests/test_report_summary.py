"""The report's first section answers the reader's question from the numbers: best exact and best
not-exact variant per setting and length with ratios and fidelity, crossovers, verdicts and what
was set aside, counted; the words shared with zoo bench; fits only from three lengths; summary.md
alone; a folder rebuilt from its own rows."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("pandas")
pytest.importorskip("seaborn")

from attention_zoo.cli import main as zoo_main
from attention_zoo.measure.cases import BenchCase
from attention_zoo.measure.labels import (
    DEFAULT_REFERENCE,
    backend_kind,
    kind_class,
    ratio_header,
    status_text,
)
from attention_zoo.report.analysis import MIN_FIT_LENGTHS
from attention_zoo.report.builder import select
from attention_zoo.report.claims import ClaimRow
from attention_zoo.report.cost import best, tie_text, tied
from attention_zoo.report.document import (
    Document,
    Heading,
    Para,
    Table,
    anchor,
    to_html,
    to_markdown,
)
from attention_zoo.report.rebuild import RUN_FIELDS, runs_from_markdown
from attention_zoo.report.summary import short_settings, summary
from attention_zoo.reproduce import REPRODUCTIONS
from attention_zoo.store import ResultStore

from .report_fixtures import LSH_BEATS_SDPA_FROM, build_busy_report


def test_what_a_backend_computes_comes_from_its_capabilities():
    assert [backend_kind(b) for b in ("full", "sdpa", "shared-qk")] == ["full"] * 3
    assert backend_kind("local") == "pattern" and backend_kind("lsh") == "approximate"
    assert backend_kind("hf:lsh") == "approximate"  # a peer computes what it mirrors
    assert backend_kind("local+lsh") == "approximate"  # a mix: its least exact layer
    assert backend_kind("lsh-4") == "approximate"  # a task's variant: hash count after a dash
    assert backend_kind("no-such-backend") == "?"
    assert kind_class("full") == "exact" and kind_class("pattern") == kind_class("approximate")


def test_one_vocabulary_for_ratios_and_statuses():
    assert DEFAULT_REFERENCE in ("full", "sdpa")  # an exact backend: ratios below one are gains
    assert ratio_header("time", "full") == "time x full"
    assert ratio_header("memory", "hf") == "memory x hf"
    assert status_text("skipped", "xformers kernels need CUDA") == "n/a: xformers kernels need CUDA"
    assert status_text("oom") == "OOM"


def test_short_settings_keep_only_what_tells_them_apart():
    names = [
        "block, forward, float32, cpu",
        "block, forward, bfloat16, cpu",
        "model, forward, float32, cpu",
    ]
    assert short_settings(names) == {
        names[0]: "block, float32",
        names[1]: "block, bfloat16",
        names[2]: "model, float32",
    }
    assert short_settings(["a, b"]) == {"a, b": "a, b"}
    assert MIN_FIT_LENGTHS == 3


class _Planted:
    """A reproduction whose claims carry the given verdicts, each naming one row."""

    name, title, command, plots = "planted", "Planted claims", "zoo reproduce planted", ()

    def __init__(self, *verdicts: str) -> None:
        self.verdicts = verdicts

    def claims(self, rows):
        return [
            ClaimRow(claim=f"claim {i}", setting="-", published="-", ours="-", rule="-",
                     verdict=v, rows_used=(f"run/{i}",))
            for i, v in enumerate(self.verdicts)
        ]  # fmt: skip

    def report_sections(self, ctx):
        return []


def _claims_sentence(tmp_path, source: _Planted) -> tuple[str, list]:
    with ResultStore(tmp_path / "empty.sqlite") as store:
        ctx = select(store.to_dataframe(), store.runs())
    paras = [b.text for b in summary(ctx, None, [source]) if isinstance(b, Para)]
    (sentence,) = [p for p in paras if "claims by verdict" in p]
    return sentence, ctx.ledger.entries


def test_the_summary_counts_undecided_claims_as_undecided(tmp_path):
    """Each "undecided: <why>" is counted as undecided, never as holds, with the rows it used;
    a summary where every claim was decided still says undecided: 0."""
    planted = _Planted(
        "holds",
        "undecided: fewer than 3 seeds",
        "undecided: the reference did not learn the task at this scale",
        "does not hold here",
        "not measured",
    )
    sentence, entries = _claims_sentence(tmp_path, planted)
    assert sentence.endswith("holds: 1, does not hold here: 1, undecided: 2, not measured: 1."), (
        sentence
    )
    assert {"run/1 run/2"} == {e.params["rows used"] for e in entries if e.text == "2"}
    decided, _ = _claims_sentence(tmp_path, _Planted("holds", "holds"))
    assert decided.endswith("holds: 2, undecided: 0."), decided


def test_sections_links_and_scroll_boxes_render_alike(tmp_path):
    doc = Document("t")
    doc.add(Heading(1, "Summary"), Para("see [Cases without numbers](#cases-without-numbers)"))
    doc.add(Table(["a"], [["1"]]), Heading(1, "Cases without numbers"), Para("none"))
    html = to_html(doc)
    assert '<section id="summary">' in html and '<section id="cases-without-numbers">' in html
    assert '<a href="#cases-without-numbers">Cases without numbers</a>' in html
    assert '<div class="scroll"><table>' in html and 'name="viewport"' in html
    assert "(#cases-without-numbers)" in to_markdown(doc)
    assert "(report.md#cases-without-numbers)" in to_markdown(doc, links_to="report.md")
    assert anchor("Fidelity x cost") == "fidelity-x-cost" and anchor("`a`, b") == "a-b"


def test_runs_come_back_from_an_older_folders_provenance_table():
    markdown = (
        "## Provenance\n\n| run | kind | started | git commit | torch | device | threads | cores "
        "| load at start | load at end | busy |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
        "| `r1` | bench | `2026-11-23 18:13 UTC` | `abc+dirty` (dirty) | `2.13.0+cpu` | `AMD EPYC` "
        "| 2 | 2 | 0.14 | - | no |\n"
    )
    (run,) = runs_from_markdown(markdown)
    assert run["run_id"] == "r1" and run["git_commit"] == "abc+dirty" and run["threads"] == 2
    assert run["load_start"] == 0.14 and run["load_end"] is None and run["meta"] == {}
    assert run["started_at"] == 1795457580.0


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_busy_report(tmp_path_factory.mktemp("summary"), reference="full")


def _summary_rows(text: str) -> list[list[str]]:
    lines = text.split("## Summary", 1)[1].split("\n## ", 1)[0].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| setting |"))
    return [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in lines[start + 2 :]
        if line.startswith("|")
    ]


@pytest.mark.slow
def test_the_summary_is_first_and_made_of_the_numbers(built):
    _, files = built
    text = files.markdown.read_text()
    assert text.index("## Summary") < text.index("## Headline")
    rows = {r[1]: r for r in _summary_rows(text)}
    # ratios to full (the fixture's reference); lsh's approx_error on peaked inputs: 0.25 at 1024
    assert rows["1024"][2:4] == ["`sdpa` 0.500x", "`lsh` 0.977x, error 0.250"]
    assert rows["256"][0] == "`block, forward, batch=1, heads=4, head_dim=64, hidden=256`"
    # 4096: full ran out of memory, so no ratio: the value with its unit instead
    assert rows["4096"][2] == "`sdpa` 6.36 ms"
    # at the set-aside length neither exact time is ranked (busy full, unstable sdpa): said so
    assert rows["512"][2] == "not ranked: `full`, `sdpa` set aside"
    # memory is never set aside; equal peaks tie (and neither counts as a win)
    assert rows["512"][4] == "`full` 1.00x (tied with `sdpa`)"
    summary = text.split("## Summary", 1)[1].split("\n## ", 1)[0]
    # the crossovers per setting, in a table of their own below
    crossovers = summary.split("| setting | time crossover |", 1)[1].splitlines()
    forward = next(line for line in crossovers if line.startswith(f"| {rows['256'][0]} |"))
    assert f"| `lsh` below `sdpa`: from L ≈ {LSH_BEATS_SDPA_FROM:.0f} |" in forward
    assert "**Exact**: fastest `sdpa` (at 3 of 4)" in summary
    # the verdicts counted: as many as the Claims table has lines, each verdict as it says
    counted = re.search(r"claims by verdict \(\[Claims\]\(#claims\)\): (.+)\.", summary)
    counts = dict(part.rsplit(": ", 1) for part in counted.group(1).split(", "))
    claims = text.split("## Claims", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in claims.splitlines() if line.startswith("| ")]
    lines = [line for line in lines if not line.startswith("| claim |")]  # one table per rule
    # each rule stated once above its table, which is at most 7 columns wide
    assert "| verdict rule |" not in claims and "**Verdict rule**:" in claims
    assert all(line.count(" | ") + 1 <= 7 for line in lines)
    assert sum(map(int, counts.values())) == len(lines) > 0
    assert all(sum(f"| {v} |" in line for line in lines) == int(n) for v, n in counts.items())
    assert "1 taken while the machine was busy, 1 unstable" in summary
    assert "1 out of memory" in summary and "(#cases-without-numbers)" in summary
    assert "none measured" in summary  # a setting of local variants only: no exact one
    assert "hidden=64` (approx_error not measured)" in summary  # said once per setting


@pytest.mark.slow
def test_summary_md_is_the_summary_alone_linking_into_the_report(built):
    _, files = built
    alone = files.summary.read_text()
    assert alone.startswith("# attention-zoo comparison\n\n## Summary")
    assert "## Headline" not in alone and "(report.md#claims)" in alone
    assert len(alone) < 65536  # a GitHub comment's limit
    section = files.markdown.read_text().split("## Headline")[0]
    assert alone.replace("(report.md#", "(#").strip() == section.strip()


@pytest.mark.slow
def test_a_folder_rebuilds_from_its_own_rows_with_the_same_numbers(tmp_path, capsys):
    # with every registered reproduction, as `zoo report` (and --from, rebuilding it) builds it
    _, files = build_busy_report(
        tmp_path, reference="full", reproductions=list(REPRODUCTIONS), title="A titled report"
    )
    source, again_dir = str(files.markdown.parent), str(tmp_path / "again")
    assert zoo_main(["report", "--from", source, "--out", again_dir]) == 0  # keeps its reference
    again = (tmp_path / "again" / "report.md").read_text()
    strip = lambda t: t.split("## Provenance")[0]  # noqa: E731  (the build time differs)
    assert strip(again) == strip(files.markdown.read_text())
    assert again.startswith("# A titled report\n")  # the folder's own title, not the default
    meta = json.loads((tmp_path / "again" / "report.json").read_text())
    assert meta["command"].startswith(f"zoo report --from {files.markdown.parent}")
    assert json.loads((tmp_path / "again" / "runs.json").read_text())
    assert zoo_main(["report", "--from", str(tmp_path)]) == 2
    assert "holds no rows.csv" in capsys.readouterr().err


def test_summary_links_point_into_the_report_wherever_they_stand():
    """A link to a section of the full report, in a paragraph, a table's caption or cell, or an
    image's caption: into report.md from summary.md (it has no such section itself)."""
    doc = Document("t")
    doc.add(
        Para("see [Decoding](#decoding)"),
        Table(["a"], [["[Claims](#claims)"]], caption="as [Decoding](#decoding) shows"),
    )
    text = to_markdown(doc, links_to="report.md")
    assert "(#" not in text and text.count("(report.md#") == 3


def test_times_within_each_others_noise_are_tied_not_ranked():
    """Medians closer than the larger interquartile range: a tie (no winner counted); farther
    apart, or another class: a ranking."""
    import pandas as pd  # after the module's importorskip

    def row(variant, median, iqr, computes="exact pattern"):
        metrics = {"time_median": median, "time_iqr": iqr, "peak_bytes": 1.0}
        return {"variant": variant, "computes": computes, "status": "ok", "metrics": metrics,
                "busy": False, "unstable": False}  # fmt: skip

    at_n = pd.DataFrame([row("a", 1.00, 0.02), row("b", 1.01, 0.01), row("c", 1.10, 0.02),
                         row("d", 1.005, 0.1, computes="full")])  # fmt: skip
    winner = best(at_n, "time_median")["not exact"]
    assert winner["variant"] == "a"
    assert [r["variant"] for r in tied(at_n, winner, "time_median")] == ["b"]
    assert tie_text(tied(at_n, winner, "time_median")) == " (tied with `b`)"
    assert [r["variant"] for r in tied(at_n, winner, "peak_bytes")] == ["b", "c"]  # equal peaks
    unknown = pd.DataFrame([row("a", 1.0, float("nan")), row("b", 1.05, 0.1)])  # no IQR: 0
    assert [r["variant"] for r in tied(at_n=unknown, winner=unknown.iloc[0], metric="time_median")
            ] == ["b"]  # fmt: skip


@pytest.mark.slow
def test_a_store_of_failed_cases_summarises_without_ranking_nothing(tmp_path, capsys):
    """No winner line over no wins, no table of no rows: one line that says where to look."""
    path = tmp_path / "s.sqlite"
    with ResultStore(path) as store:
        run_id = store.start_run()
        for backend in ("full", "sdpa"):
            case = BenchCase(target="attention", backend=backend, seq_len=64)
            store.add_rows(run_id, case.key(), case.to_dict(), [], status="error", error="boom")
        store.finish_run(run_id)
    assert zoo_main(["report", "--store", str(path), "--out", str(tmp_path / "r")]) == 0
    capsys.readouterr()
    summary = (tmp_path / "r" / "summary.md").read_text()
    assert "1 setting on" in summary and "length 64." in summary
    assert "No case has numbers to rank" in summary
    assert "Most often best" not in summary and "| setting | L |" not in summary


@pytest.mark.slow
def test_variants_best_equally_often_are_all_named(tmp_path, capsys):
    """`local` fastest in one setting and `linear` in the other, at two lengths each: the summary
    names both (2 of 4 each), never whichever was counted first."""
    path = tmp_path / "s.sqlite"
    fast = {"forward": "local", "forward+backward": "linear"}
    with ResultStore(path) as store:
        run_id = store.start_run()
        for mode, winner in fast.items():
            for n in (64, 128):
                for backend, t in (("sdpa", 1.0), ("local", 2.0), ("linear", 2.0)):
                    t = 0.5 if backend == winner else t
                    case = BenchCase(target="attention", backend=backend, seq_len=n, mode=mode)
                    metrics = [("time_median", t, "s"), ("time_iqr", 0.01, "s"),
                               ("peak_bytes", 1e6, "bytes")]  # fmt: skip
                    store.add_rows(run_id, case.key(), case.to_dict(), metrics)
        store.finish_run(run_id)
    assert zoo_main(["report", "--store", str(path), "--out", str(tmp_path / "r")]) == 0
    capsys.readouterr()
    summary = (tmp_path / "r" / "summary.md").read_text()
    named = summary.split("**Not exact**: fastest ", 1)[1].split(".", 1)[0]
    assert sorted(named.split(" and ")) == ["`linear` (at 2 of 4)", "`local` (at 2 of 4)"]


_HEADER = "run_id,case_key,status,metric,value,unit,threads,config,error\n"
_ROW = 'r1,k1,ok,time_median_s,0.5,s,2,"{""backend"": ""full""}",\n'
_RUNS = json.dumps([{name: None for name in RUN_FIELDS} | {"run_id": "r1", "meta": {}}])
_FOLDER = {"rows.csv": _HEADER + _ROW, "runs.json": _RUNS, "report.json": "{}"}


@pytest.mark.slow  # builds a whole report
def test_the_damaged_folders_fixture_rebuilds_whole(tmp_path, capsys):
    for file, content in _FOLDER.items():
        (tmp_path / file).write_text(content)
    assert zoo_main(["report", "--from", str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "report.md").is_file()


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        ("runs.json", "{", "runs.json is damaged (not JSON"),
        ("runs.json", '"x"', "runs.json is damaged (not a list of runs"),
        ("runs.json", '[{"run_id": "r1"}]', "not a list of runs, each with cpu_count, device_name"),
        ("runs.json", None, "no runs.json (nor a report.md that lists its runs)"),
        ("report.json", "[1,2", "report.json is damaged (not JSON"),
        ("report.json", "[]", "report.json is damaged (not a JSON object)"),
        ("rows.csv", "", "rows.csv is damaged"),
        ("rows.csv", "a,b\n1,2\n", "no column run_id, case_key"),
        ("rows.csv", _HEADER + _ROW.replace('""full""}', '""full'), "not JSON"),
        ("rows.csv", _HEADER + _ROW.replace('"{""backend"": ""full""}"', "7"), "not a JSON object"),
    ],
)
def test_a_damaged_folder_is_refused_in_one_line_and_left_as_it_was(
    tmp_path, capsys, name, text, said
):
    files = {**_FOLDER, name: text}
    for file, content in files.items():
        if content is not None:
            (tmp_path / file).write_text(content)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert zoo_main(["report", "--from", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert said in err and "zoo report --store FILE --out FOLDER" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
