"""The report: stored numbers in the right cells, one label per configuration, one row per
configuration (latest run, stated), every distinguishing parameter shown, busy and unstable
timings marked and never ranked, fitted or divided,
empty sections saying which command fills them, and the command line around it."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pandas")
pytest.importorskip("seaborn")

from attention_zoo.cli import main as zoo_main
from attention_zoo.measure.labels import case_label, variant_label
from attention_zoo.report import build_report, builder
from attention_zoo.report.accuracy import task_tables
from attention_zoo.report.claims import NOT_MEASURED, ClaimRow, claim_verdicts
from attention_zoo.report.document import Heading, Para, Table
from attention_zoo.report.index import write_index
from attention_zoo.reproduce import get_reproduction
from attention_zoo.store import ResultStore
from attention_zoo.tasks.results import KIND, save_trained

from .report_fixtures import (
    LSH_BEATS_SDPA_FROM,
    SET_ASIDE_LENGTH,
    block_case,
    build_busy_report,
    make_store,
)


def _table(text: str, heading: str, header: str) -> list[list[str]]:
    """Rows of the first table after `heading` whose header row starts with `header`."""
    section = text.split(heading, 1)[1]
    lines = section.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {header} |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def _name(cell: str) -> str:
    """The variant of a `variant` · kernel · computes cell."""
    return cell.split(" · ")[0]


REFORMER = get_reproduction("reformer")
FORWARD = "### `block, forward, causal, batch=1, heads=4, head_dim=64, hidden=256, float32"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    _, files = build_busy_report(tmp_path_factory.mktemp("report"), reference="sdpa")
    return files, files.markdown.read_text()


@pytest.mark.slow
def test_headline_cells_hold_stored_numbers_ratios_and_statuses(built):
    _, text = built
    # the time table: L, `variant` · kernel · computes, median ± IQR, ratio, note
    rows = {(r[0], _name(r[1])): r for r in _table(text, FORWARD, "L | variant")}
    # the memory table: L, variant, peak, ratio
    memory = {(r[0], r[1]): r for r in _table(text, FORWARD, "L | variant | peak (measured) [MiB]")}
    # full at L=1024: 1e-9 * 1024**2 s = 1.05 ms, IQR 1/20 of it; the planted rows store no
    # implementation: the cell names none
    assert rows[("1024", "`full`")][1:4] == ["`full` · exact", "1.05 ± 0.0524", "2.00x"]
    assert rows[("1024", "`lsh`")][1] == "`lsh` · approximate"  # the backend's capabilities
    # set aside: shown with their marks, in no ratio; memory is never set aside
    at = str(SET_ASIDE_LENGTH)
    assert rows[(at, "`full`")][2:4] == ["1,000† ± 50.0", "-"]
    assert memory[(at, "`full`")][2:4] == ["0.00000954", "1.00x"]
    assert rows[(at, "`sdpa`")][2:4] == ["1,000‡ ± 1,000", "-"]
    assert rows[("4096", "`full`")][2:4] == ["OOM", "-"]
    assert memory[("4096", "`full`")][2:4] == ["OOM", "-"]
    # a case without numbers says why in its note, as zoo bench does
    assert rows[("4096", "`full`")][-1] == "`OOM: predicted 30 GiB > 20 GiB`"
    assert rows[("256", "`sdpa`")][3] == "1.00x"
    # lsh with num_hashes=1 (the default) is plain `lsh`: one label per configuration
    assert ("1024", "`lsh`") in rows and not any("num_hashes=1" in k[1] for k in rows)
    # fastest and leanest per class, each with its value: exact, not exact
    fastest = {r[0]: r[1:] for r in _table(text, FORWARD, "L | fastest exact")}
    assert fastest["4096"][:2] == ["`sdpa` 6.36 ms", "`lsh` 4.10 ms"]
    # the busy run's lsh read every core free around its own timing: kept, and the fastest
    # there; full (timed in the same busy run without a reading) and the unstable sdpa are not
    assert fastest[at][:2] == ["-", "`lsh` 0.512 ms"]
    assert rows[(at, "`lsh`")][2:4] == ["0.512 ± 0.0256", "-"]  # no ratio to a time set aside
    assert "2 of 19 times set aside (1 taken while the machine was busy, †; 1 unstable" in text


@pytest.mark.slow
def test_scaling_exponents_and_crossovers(built):
    files, text = built
    scaling = text.split("## Scaling")[1]
    exponents = {r[0]: r[1:] for r in _table(scaling, FORWARD, "variant")}
    # columns: computes, time exponent, R², memory exponent, R²; full's times: two lengths only
    assert exponents["`full`"][:3] == ["exact", "not enough lengths", "-"]
    assert exponents["`lsh`"] == ["approximate", "1.00", "1.000", "1.00", "1.000"]
    assert exponents["`sdpa`"][1:3] == ["1.80", "1.000"]
    # sdpa's memory at the set-aside length is off its law (never set aside): a poor fit
    assert float(exponents["`sdpa`"][4]) < 0.5
    times = {r[0]: r[1:] for r in _table(scaling, "Crossovers in time", "variant \\ beats")}
    # full has two trusted times: in no crossover; columns: lsh, sdpa
    assert "`full`" not in times
    assert times["`lsh`"][1] == f"from L ≈ {LSH_BEATS_SDPA_FROM:.0f}"
    assert times["`sdpa`"][0] == "not within the measured range"
    assert {p.name for p in files.plots} >= {"scaling-1.png", "pareto-duplication-tiny.png"}
    assert all(p.stat().st_size > 5000 for p in files.plots)


@pytest.mark.slow
def test_accuracy_cost_table2_and_block_variants(built):
    _, text = built
    acc = _table(text.split("## Accuracy x cost")[1], "###", "trained with")
    assert ["`lsh-2`", "`seed=1`", "70.0%", "200", "10.0", "3.00", "yes"] in acc
    assert ["`shared-qk`", "`seed=0`", "90.0%", "100", "20.0", "4.00", ""] in acc
    table2 = {
        r[0]: r[1:]
        for r in _table(text.split("## Task results")[1], "preset `tiny`", "train \\ eval")
    }
    assert table2["`shared-qk` (seeds `0,1`)"][:2] == ["95.0%", "47.5%"]  # mean over two seeds
    published = {
        r[0]: r[1:] for r in _table(text.split("## Table 2")[1], "### published", "train \\ eval")
    }
    assert published["`lsh-4`"][1] == "100.0%"
    blocks = _table(text.split("## Block variants")[1], "Residual", "setting")
    per_layer = {r[1]: (r[4], r[6]) for r in blocks}
    assert per_layer == {"`reversible`": ("1.00", "1.50x"), "`standard`": ("4.00", "1.00x")}
    chunks = _table(text.split("## Block variants")[1], "Feed-forward", "setting")
    assert chunks[0][2] == "exact pattern" and chunks[0][4:] == ["0.500x", "1.00x"]


@pytest.mark.slow
def test_missing_provenance_claims_and_the_same_content_in_html(built):
    files, text = built
    missing = _table(text, "## Cases without numbers", "case")
    assert missing[0][1] == "exact" and missing[0][4:] == ["OOM", "`predicted 30 GiB > 20 GiB`"]
    provenance = _table(text, "## Provenance", "run")
    # run, kind, started, git commit, machine, load start → end, busy
    assert any(r[5] == "40.00 → 0.00" and r[6] == "yes" for r in provenance)
    assert all(r[4].endswith(" · 2 cores") for r in provenance)
    assert "## Claims" in text
    html = files.html.read_text()
    assert '<td class="num">1,000† ± 50.0</td>' in html and "data:image/png;base64," in html
    assert files.csv.read_text().count("\n") > 20


def test_labels_resolve_defaults_and_mark_peers():
    assert variant_label("lsh", {"num_hashes": 1}) == "lsh" == variant_label("lsh", {})
    assert variant_label("lsh", {"num_hashes": 4, "chunk_length": 64}) == "lsh(num_hashes=4)"
    assert variant_label("mine-unregistered", {"a": 1}) == "mine-unregistered(a=1)"
    assert case_label({"backend": "hf:lsh", "options": {"num_hashes": 4}}) == (
        "hf:lsh(num_hashes=4) (peer)"
    )
    assert case_label({"backend": "lsh", "label": "small", "options": {"num_hashes": 2}}) == (
        "small(num_hashes=2)"
    )


def _two_runs(path, *, second):
    """Two runs of one configuration (spelled lsh and lsh(num_hashes=1)) and other cases."""
    with ResultStore(path) as store:
        for options, value in (({}, 0.5), (second, 0.25)):
            run = store.start_run(kind="bench", device="cpu")
            case = block_case("lsh", 1024, options=options)
            store.add_rows(run, None, case.to_dict(), [("time_median", value, "s")])
            store.finish_run(run)
        run = store.start_run(kind="bench", device="cpu")
        for changes in ({"causal": False}, {"batch": 2}, {"dtype": "bfloat16"}):
            case = block_case("lsh", 1024, **changes)
            store.add_rows(run, None, case.to_dict(), [("time_median", 1.0, "s")])
        return store.to_dataframe(), store.runs()


@pytest.mark.slow
def test_one_row_per_configuration_latest_run_and_every_parameter_shown(tmp_path):
    df, runs = _two_runs(tmp_path / "s.sqlite", second={"num_hashes": 1})
    text = build_report(df, tmp_path / "rep", runs=runs).markdown.read_text()
    headline = text.split("## Scaling")[0]
    rows = _table(headline, FORWARD, "L | variant")
    # the latest run, not the mean (the † of a busy machine aside)
    assert [[r[0], _name(r[1]), r[2].rstrip("†")] for r in rows] == [["1024", "`lsh`", "250"]]
    assert "the latest stored run of it" in text
    # cases differing only in causal, batch or dtype are separate settings, named as such
    assert "### `block, forward, non-causal, batch=1" in headline
    assert "### `block, forward, causal, batch=2," in headline
    assert ", bfloat16, cpu" in headline


def test_report_of_an_empty_store_says_which_command_fills_each_section(tmp_path, capsys):
    path = tmp_path / "empty.sqlite"
    ResultStore(path).close()
    assert zoo_main(["report", "--store", str(path)]) == 2  # bad input, like a missing store
    assert "zoo bench --preset quick" in capsys.readouterr().err


@pytest.mark.slow
def test_sections_without_rows_name_their_command(tmp_path):
    df, runs = _two_runs(tmp_path / "s.sqlite", second={})
    text = build_report(df, tmp_path / "rep", runs=runs, reproductions=[REFORMER])
    text = text.markdown.read_text()
    assert "## Task results\n\nNo rows for this section; run `zoo task NAME" in text
    assert "## Table 2" not in text  # the Reformer's own section: only with duplication runs
    assert "## Block variants\n\nNo rows for this section; run `" in text


@pytest.mark.slow
def test_zoo_report_command_writes_the_folder_and_the_index(tmp_path, capsys):
    store = make_store(tmp_path / "s.sqlite")
    out = tmp_path / "reports" / "cpu-test"
    index = tmp_path / "reports" / "README.md"
    (tmp_path / "reports" / "hand-written").mkdir(parents=True)
    args = ["report", "--store", str(store), "--out", str(out), "--index", str(index)]
    assert zoo_main(args) == 0
    assert {"report.html", "report.md", "rows.csv", "numbers.json", "report.json"} <= {
        p.name for p in out.iterdir()
    }
    meta = json.loads((out / "report.json").read_text())
    # a store outside the folder the command ran in: its file name (no machine's folders)
    assert meta["command"] == f"zoo report --store {store.name} --out {out} --index {index}"
    readme = index.read_text()
    assert "[cpu-test](cpu-test/report.md)" in readme and meta["command"] in readme
    assert "`hand-written`" in readme
    assert zoo_main(["report", "--store", str(store), "--run-id", "nope"]) == 2
    latest = tmp_path / "latest"  # as zoo results takes it; the command records the run's id
    assert (
        zoo_main(["report", "--store", str(store), "--run-id", "latest", "--out", str(latest)]) == 0
    )
    run_id = json.loads((latest / "runs.json").read_text())[-1]["run_id"]
    assert f"--run-id {run_id}" in json.loads((latest / "report.json").read_text())["command"]


def test_index_without_reports(tmp_path):
    readme = write_index(tmp_path / "README.md")
    assert "No generated report yet" in readme.read_text()


def test_task_tables_average_over_seeds_at_one_length_and_say_so(tmp_path):
    """A task preset stored at two lengths gets one table per length, each cell the mean of that
    length's seeds (never of lengths together), its caption saying over what."""
    planted = {(64, 0): 0.9, (64, 1): 0.8, (128, 0): 0.3, (128, 1): 0.1}
    with ResultStore(tmp_path / "s.sqlite") as store:
        run_id = store.start_run(kind=KIND)
        for (length, seed), accuracy in planted.items():
            row = {"task": "associative-recall", "preset": "p", "backend": "full",
                   "length": length, "seed": seed, "eval": "trained"}  # fmt: skip
            save_trained(store, run_id, {"length": length},
                         [{**row, "metric": "accuracy", "value": accuracy}])  # fmt: skip
        store.finish_run(run_id)
        ctx = builder.select(store.to_dataframe(), store.runs())
    blocks = task_tables(ctx)
    headings = [b.text for b in blocks if isinstance(b, Heading) and b.level == 2]
    assert headings == [
        "`associative-recall` / preset `p`, L 64: accuracy",
        "`associative-recall` / preset `p`, L 128: accuracy",
    ]
    tables = [b for b in blocks if isinstance(b, Table)]
    assert [t.rows for t in tables] == [
        [["`full` (seeds `0,1`)", "85.0%"]],
        [["`full` (seeds `0,1`)", "20.0%"]],
    ]
    assert [t.caption for t in tables] == [
        "Mean over the seeds each row names, at length 64.",
        "Mean over the seeds each row names, at length 128.",
    ]


def test_task_tables_put_a_ladders_rungs_shortest_first(tmp_path):
    """Rungs stored as presets of their own (`<ladder>-n<length>`) are tabulated by length, the
    numbers in their names read as numbers (n32 before n128, not after it)."""
    with ResultStore(tmp_path / "s.sqlite") as store:
        run_id = store.start_run(kind=KIND)
        for length in (128, 32, 512):
            row = {"task": "niah", "preset": f"ladder-n{length}", "backend": "full",
                   "length": length, "seed": 0, "eval": "trained"}  # fmt: skip
            save_trained(store, run_id, {"length": length},
                         [{**row, "metric": "accuracy", "value": 0.5}])  # fmt: skip
        store.finish_run(run_id)
        ctx = builder.select(store.to_dataframe(), store.runs())
    headings = [b.text for b in task_tables(ctx) if isinstance(b, Heading) and b.level == 2]
    assert headings == [f"`niah` / preset `ladder-n{n}`, L {n}: accuracy" for n in (32, 128, 512)]


def test_task_tables_show_a_presets_latest_definition_and_count_the_earlier_runs(tmp_path):
    """Runs of one preset name stored before and after an edit of the preset (here its steps)
    are not averaged: the table holds the latest definition's runs, its caption counts the
    others (rows.csv keeps them)."""
    with ResultStore(tmp_path / "s.sqlite") as store:
        run_id = store.start_run(kind=KIND)
        for steps, seed, accuracy in ((100, 0, 0.2), (100, 1, 0.3), (200, 0, 0.9)):
            row = {"task": "associative-recall", "preset": "p", "backend": "full",
                   "length": 64, "seed": seed, "eval": "trained"}  # fmt: skip
            spec = {"seed": seed, "train": {"max_steps": steps}}
            save_trained(store, run_id, spec, [{**row, "metric": "accuracy", "value": accuracy}])
        store.finish_run(run_id)
        ctx = builder.select(store.to_dataframe(), store.runs())
    (table,) = [b for b in task_tables(ctx) if isinstance(b, Table)]
    assert table.rows == [["`full` (seeds `0`)", "90.0%"]]
    assert "2 run(s) of an earlier definition of this preset" in table.caption


@pytest.mark.parametrize(
    ("older", "kept"),
    [
        ({"model": {"num_hidden_layers": 2}, "train": {"max_steps": 1}}, False),  # depth edited
        ({"model": {"num_hidden_layers": 4}}, True),  # a training field added to the code since
    ],
)
def test_task_tables_hold_each_run_to_the_latest_definition_as_claims_do(tmp_path, older, kept):
    newer = {"model": {"num_hidden_layers": 4}, "train": {"max_steps": 1}}
    with ResultStore(tmp_path / "s.sqlite") as store:
        run_id = store.start_run(kind=KIND)
        for seed, (spec, accuracy) in enumerate(((older, 0.2), (newer, 0.9))):
            row = {"task": "associative-recall", "preset": "p", "backend": "full",
                   "length": 64, "seed": seed, "eval": "trained"}  # fmt: skip
            spec = {**spec, "seed": seed}
            save_trained(store, run_id, spec, [{**row, "metric": "accuracy", "value": accuracy}])
        store.finish_run(run_id)
        ctx = builder.select(store.to_dataframe(), store.runs())
    (table,) = [b for b in task_tables(ctx) if isinstance(b, Table)]
    assert table.rows == [
        ["`full` (seeds `0,1`)", "55.0%"] if kept else ["`full` (seeds `1`)", "90.0%"]
    ]
    assert ("earlier definition" in table.caption) is not kept


def test_cost_cases_have_the_model_key_of_their_task_runs():
    """`zoo task --cost` measures the very model each task run trained (joined by model key)."""
    from attention_zoo.report.frame import model_key
    from attention_zoo.tasks.cost import cost_cases
    from attention_zoo.tasks.runner import plan_runs
    from attention_zoo.tasks.suite import load_task_preset

    runs, _ = plan_runs(load_task_preset("duplication", "cpu"))
    cases = cost_cases(runs)
    assert sorted(c.label for c in cases) == sorted({r.variant.label for r in runs})
    for case in cases:
        spec = next(r for r in runs if r.variant.label == case.label)
        assert case.seq_len == spec.preset.task.seq_len and case.mode == "train-step"
        assert model_key(case.reformer_config().to_dict()) == model_key(spec.model_fields())


@pytest.mark.slow
def test_claims_section_renders_each_reproductions_claims(tmp_path):
    """A reproduction's claims are printed as it gives them, with its own heading; their numbers
    are recorded with the rows they used (numbers.json); one without a measured claim is named
    with its command."""

    class Given:
        name, title, command, plots = "given", "Given claims", "zoo reproduce given", ()

        def __init__(self, verdict):
            self.verdict = verdict

        def claims(self, rows):
            return [
                ClaimRow(claim="c. reversible", setting="batch 8", published="0.23x",
                         ours="0.31x", rule="within 2x", verdict=self.verdict,
                         rows_used=(f"{len(rows)} rows",))
            ]  # fmt: skip

        def report_sections(self, ctx):
            return []

    df, runs = _two_runs(tmp_path / "s.sqlite", second={})
    files = build_report(df, tmp_path / "rep", runs=runs, reproductions=[Given("holds")])
    text = files.markdown.read_text()
    claims = _table(text, "## Claims\n\n### Given claims", "claim")
    # the reproduction is given the selected rows: the earlier run of the repeated case is left out
    # its rule stated above the table; scale, interval, floor and seeds "-" (it reads no seeds):
    # no column; the rows it used are named in numbers.json, not in a column
    assert claims == [["c. reversible", "batch 8", "0.23x", "0.31x", "holds"]]
    above = "**Verdict rule**: within 2x.\n\n| claim | setting | published | ours | verdict |"
    assert above in text
    recorded = {e["text"] for e in json.loads(files.numbers.read_text()) if e["source"] == "claims"}
    assert {"0.23x", "0.31x", "within 2x"} <= recorded
    assert claim_verdicts(df, [Given("holds")]) == [("holds", f"{len(df)} rows")]
    files = build_report(df, tmp_path / "rep", runs=runs, reproductions=[Given(NOT_MEASURED)])
    text = files.markdown.read_text()
    assert "No rows for any claim yet: `given` (Given claims: run `zoo reproduce given`)" in text


@pytest.mark.slow
def test_a_peer_family_as_reference_divides_each_variant_by_its_mechanisms_peer(tmp_path):
    """`--reference hf`: lsh rows divide by hf:lsh, local rows by hf:local (as `zoo bench
    --reference hf` does), each at its own length."""
    times = {"lsh": 0.2, "hf:lsh": 0.8, "local": 0.3, "hf:local": 0.4}  # seconds at L=1024
    with ResultStore(tmp_path / "s.sqlite") as store:
        run = store.start_run(kind="bench", device="cpu")
        for backend, t in times.items():
            for n in (1024, 2048):
                rows = [("time_median", t * n / 1024, "s"), ("peak_bytes", 1000 * t, "bytes")]
                store.add_rows(run, None, block_case(backend, n).to_dict(), rows)
        store.finish_run(run)
        files = build_report(store.to_dataframe(), tmp_path / "rep", runs=store.runs(),
                             reference="hf")  # fmt: skip
    text = files.markdown.read_text()
    assert "`hf`'s module of the same mechanism (e.g. `hf:lsh` for `lsh`)" in text

    def by_mechanism(header):
        table = _table(text, "### ", header)
        return {(r[0], _name(r[1]).split("(")[0].strip("` ")): r for r in table}

    times, memory = by_mechanism("L | variant"), by_mechanism("L | variant | peak (measured) [MiB]")
    for n in ("1024", "2048"):
        assert times[(n, "lsh")][3] == "0.250x" and memory[(n, "lsh")][3] == "0.250x"
        assert times[(n, "local")][3] == "0.750x" and memory[(n, "local")][3] == "0.750x"
        assert times[(n, "hf:lsh")][3] == "1.00x"
        assert times[(n, "hf:lsh")][1].endswith(" · approximate")  # a peer computes what it mirrors
    assert "no ratios" not in text.split("## Scaling")[0]


@pytest.mark.slow
def test_a_new_section_is_a_function_and_its_entry_in_sections(tmp_path, monkeypatch):
    """Adding a report section touches its module and builder.SECTIONS: it is printed in place,
    in the markdown and the HTML, from the Context every section reads."""

    def probe(ctx):
        return [Heading(1, "Probe section"), Para(f"{len(ctx.bench)} bench cases selected")]

    sections = builder.SECTIONS
    monkeypatch.setattr(builder, "SECTIONS", (*sections[:-1], probe, sections[-1]))
    df, runs = _two_runs(tmp_path / "s.sqlite", second={})
    files = build_report(df, tmp_path / "rep", runs=runs)
    text = files.markdown.read_text()
    probe_at = text.index("\n## Probe section")
    assert text.index("\n## Claims") < probe_at < text.index("\n## Provenance")  # in place
    assert "bench cases selected" in text[probe_at:].split("\n## ", 2)[1]
    assert "Probe section" in files.html.read_text()


@pytest.mark.slow  # trains the smoke preset twice and measures its model's training step once
def test_accuracy_x_cost_shows_the_latest_definition_as_the_task_tables_do(
    tmp_path, capsys
) -> None:
    """A seed trained again with other steps: Accuracy x cost lists that seed once (the latest
    definition's run), not once per stored definition."""
    store = str(tmp_path / "zoo.sqlite")
    argv = ["task", "duplication", "--preset", "smoke", "--cost", "--store", store, "--quiet"]
    for steps in ("3", "6"):
        assert zoo_main([*argv, "--threads", "1", "--max-steps", steps]) == 0
    assert zoo_main(["report", "--store", store, "--out", str(tmp_path / "report")]) == 0
    capsys.readouterr()
    text = (tmp_path / "report" / "report.md").read_text()
    section = text.split("## Accuracy x cost")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| `shared-qk` | `seed=0`")]
    assert len(rows) == 1, section
