"""The report shows stored numbers in the right cells, statuses where there are none, and plots."""

from __future__ import annotations

import pytest

pytest.importorskip("pandas")
pytest.importorskip("seaborn")

from attention_zoo.cli import main as zoo_main
from attention_zoo.report import build_report, variant_label
from attention_zoo.store import ResultStore


def _case(backend: str, n: int, **options) -> dict:
    return {
        "target": "block",
        "backend": backend,
        "seq_len": n,
        "mode": "forward",
        "options": options,
    }


@pytest.fixture
def store(tmp_path):
    with ResultStore(tmp_path / "s.sqlite") as s:
        run = s.start_run(kind="bench", device="cpu")
        s.add_rows(
            run,
            None,
            _case("full", 1024),
            [("time_median", 0.25, "s"), ("peak_bytes", 3 * 2**20, "bytes")],
        )
        s.add_rows(
            run,
            None,
            _case("full", 4096),
            [],
            status="oom",
            error="predicted 30 GiB > limit 20 GiB",
        )
        s.add_rows(
            run,
            None,
            _case("lsh", 1024, num_hashes=4),
            [("time_median", 0.125, "s"), ("peak_bytes", 2**20, "bytes")],
        )
        s.add_rows(
            run,
            None,
            _case("lsh", 4096, num_hashes=4),
            [("time_median", 0.5, "s"), ("peak_bytes", 4 * 2**20, "bytes")],
        )
        s.finish_run(run)
        yield s


def _rows(text: str, heading: str) -> dict[str, list[str]]:
    table = text.split(heading)[1].split("####")[0]
    cells = [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in table.splitlines()
        if line.startswith("|")
    ]
    return {row[0]: row[1:] for row in cells[2:]}


def test_report_tables_put_numbers_and_statuses_in_their_cells(store, tmp_path):
    files = build_report(store.to_dataframe(), tmp_path / "rep")
    text = files.markdown.read_text()
    time_rows = _rows(text, "#### time (median) [ms], block / forward")
    assert time_rows["full"] == ["250", "OOM"]
    assert time_rows["lsh(num_hashes=4)"] == ["125", "500"]
    mem_rows = _rows(text, "#### peak memory above resident (measured) [MiB], block / forward")
    assert mem_rows["lsh(num_hashes=4)"] == ["1", "4"]
    assert "predicted 30 GiB > limit 20 GiB" in text  # the reason of a case without numbers
    assert {p.name for p in files.plots} == {"time_median.png", "peak_bytes.png"}
    assert all(p.stat().st_size > 1000 for p in files.plots)


def test_variant_label():
    assert (
        variant_label("lsh", {"num_hashes": 4, "chunk_length": 64})
        == "lsh(chunk_length=64, num_hashes=4)"
    )
    assert variant_label("full", {}) == "full"


def test_zoo_report_command(store, tmp_path, capsys):
    out = tmp_path / "cli-rep"
    assert zoo_main(["report", "--store", str(store.path), "--out", str(out)]) == 0
    assert (out / "report.md").exists() and "report:" in capsys.readouterr().out


def test_zoo_report_without_runs_says_what_to_do(tmp_path, capsys):
    path = tmp_path / "empty.sqlite"
    ResultStore(path).close()
    assert zoo_main(["report", "--store", str(path)]) == 1
    assert "zoo bench --preset quick" in capsys.readouterr().out


def test_labelled_variants_keep_their_options_in_tables():
    """A model sweep labels every case with the model's name; the options still tell rows apart,
    in the bench table and in the report alike."""
    from attention_zoo.measure.table import comparison_table

    def case(hashes):
        config = {"target": "model", "backend": "lsh", "label": "small", "seq_len": 1024,
                  "batch": 1, "mode": "train-step", "dtype": "float32",
                  "options": {"num_hashes": hashes}}  # fmt: skip
        return {"config": config, "status": "ok", "metrics": {"time_median": 1.0}}

    table = comparison_table([case(2), case(4)])
    assert "small(num_hashes=2)" in table and "small(num_hashes=4)" in table
