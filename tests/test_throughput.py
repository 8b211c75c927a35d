"""Achieved FLOP rate and share of the device's dense peak: the derived numbers from planted rows,
the peak table's lookup, CPU rows without a share, and the columns in `zoo bench`'s table,
`zoo results` (table, CSV, JSON) and the report."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from attention_zoo.cli import main
from attention_zoo.measure.cases import BenchCase
from attention_zoo.measure.env import Environment
from attention_zoo.measure.load import Load
from attention_zoo.measure.peaks import device_peak, match_device
from attention_zoo.measure.predict import predict_case
from attention_zoo.measure.table import comparison_table, group_cases
from attention_zoo.measure.throughput import (
    FLOP_RATE,
    OVER_PEAK,
    PEAK_SHARE,
    PEAK_UNKNOWN,
    RATE_HEADER,
    SHARE_HEADER,
    case_throughput,
    share_cell,
    throughput,
)
from attention_zoo.measure.units import format_percent
from attention_zoo.store import ResultStore

H100 = "NVIDIA H100 80GB HBM3"
CPU_NAME = "AMD EPYC 7B13"
# (device, name, dtype, flops, median seconds) -> TFLOP/s text, % peak text
PLANTED = {
    "sdpa": ("cuda", H100, "bfloat16", 2e12, 4e-3),  # 500 TFLOP/s: 50.5% of 989.4
    "full": ("cuda", H100, "float32", 1e11, 5e-3),  # 20 TFLOP/s: 29.9% of 66.9 (no TF32)
    "local": ("cpu", CPU_NAME, "float32", 3e9, 0.1),  # 0.03 TFLOP/s, no peak
}
EXPECTED = {"sdpa": ("500", "50.5%"), "full": ("20.0", "29.9%"), "local": ("0.0300", PEAK_UNKNOWN)}


@pytest.mark.parametrize(
    ("name", "dtype", "tf32", "model", "tflops"),
    [
        (H100, "bfloat16", None, "H100 SXM", 989.4),
        ("NVIDIA H100 SXM5 80GB", "float16", None, "H100 SXM", 989.4),
        (H100, "float32", False, "H100 SXM", 66.9),  # torch's default: the CUDA-core peak
        (H100, "float32", True, "H100 SXM", 494.7),  # TF32 allowed: the tensor-core peak
        (H100, "float64", None, "H100 SXM", 66.9),
        ("NVIDIA H100 PCIe", "bfloat16", None, "H100 PCIe", 756.5),
        ("NVIDIA H200", "bfloat16", None, "H200", 989.4),
        ("NVIDIA A100-SXM4-80GB", "bfloat16", None, "A100", 312.0),
        ("NVIDIA A100 80GB PCIe", "float32", False, "A100", 19.5),
        ("NVIDIA A100-PCIE-40GB", "float64", None, "A100", 19.5),
        ("NVIDIA L40S", "bfloat16", None, "L40S", 362.05),
        ("NVIDIA L4", "float32", True, "L4", 60.0),
    ],
)
def test_the_peak_of_a_known_device_name(name, dtype, tf32, model, tflops) -> None:
    peak = device_peak(name, dtype, tf32=tf32)
    assert peak is not None and peak.device == model
    assert peak.flops_per_s == pytest.approx(tflops * 1e12)


@pytest.mark.parametrize(
    ("name", "dtype", "tf32"),
    [
        ("NVIDIA H100 NVL", "bfloat16", None),  # other clocks: not the SXM's peak
        ("NVIDIA H200 NVL", "bfloat16", None),
        ("NVIDIA GH200 480GB", "bfloat16", None),
        ("NVIDIA L40", "bfloat16", None),
        ("Tesla T4", "float16", None),
        (CPU_NAME, "float32", False),
        (H100, "float32", None),  # TF32 not recorded: which peak applies is not known
        ("NVIDIA L4", "float64", None),  # its datasheet gives no FP64 figure
    ],
)
def test_no_peak_is_guessed(name, dtype, tf32) -> None:
    assert device_peak(name, dtype, tf32=tf32) is None


def test_the_rate_is_counted_flops_over_the_median_time() -> None:
    found = throughput(
        {"flops": 2e12, "time_median": 4e-3}, device="cuda:0", device_name=H100,
        dtype="bfloat16", tf32=None,
    )  # fmt: skip
    assert found.flops_per_s == pytest.approx(5e14)
    assert found.share == pytest.approx(5e14 / 989.4e12)
    for missing in ({"flops": 2e12}, {"time_median": 4e-3}, {"flops": 0, "time_median": 4e-3}):
        assert (
            throughput(missing, device="cuda", device_name=H100, dtype="bfloat16", tf32=None)
            is None
        )


def test_a_cpu_row_has_a_rate_and_no_share() -> None:
    metrics = {"flops": 3e9, "time_median": 0.1}
    for name in (CPU_NAME, H100):  # only a CUDA case has a device peak, whatever its name says
        found = throughput(metrics, device="cpu", device_name=name, dtype="bfloat16", tf32=None)
        assert found.flops_per_s == pytest.approx(3e10)
        assert found.share is None and share_cell(found) == PEAK_UNKNOWN


def test_the_flop_count_of_forward_and_backward_covers_the_backward() -> None:
    """SDPA's backward is counted as five n x n products (scores recomputed) against two forward;
    a materialising backend's autograd does four, so the step counts 3.5x / 3x its forward."""

    def flops(backend: str, mode: str) -> int:
        return predict_case(
            BenchCase(target="attention", backend=backend, seq_len=128, mode=mode)
        ).flops

    forward = 4 * 1 * 4 * 128 * 128 * 64  # 2 products of 2 b h n^2 d FLOPs (causal: counted full)
    assert flops("sdpa", "forward") == flops("full", "forward") == forward
    assert flops("sdpa", "forward+backward") == 3.5 * forward
    assert flops("full", "forward+backward") == 3 * forward


def _planted_store(path: Path) -> Path:
    """An H100 run (bfloat16 sdpa, float32 full, TF32 off) and a CPU run: known FLOPs and times."""
    idle = Load(0.0, "sampled")
    with ResultStore(path) as store:
        runs = {}
        for device, name in (("cuda", H100), ("cpu", CPU_NAME)):
            env = Environment(
                git_commit="abc", torch_version="9.9", device_name=name, threads=1,
                cuda_matmul_tf32=False if device == "cuda" else None,
            )  # fmt: skip
            runs[device] = (store.start_run(environment=env, device=device, load=idle), env)
        for backend, (device, _, dtype, flops, seconds) in PLANTED.items():
            run, env = runs[device]
            case = BenchCase(target="attention", backend=backend, seq_len=4096, dtype=dtype,
                             device=device, mode="forward+backward")  # fmt: skip
            rows = [("flops", flops, "flop"), ("time_median", seconds, "s"),
                    ("time_iqr", seconds / 100, "s"), ("peak_bytes", 2**20, "bytes")]  # fmt: skip
            store.add_rows(run, None, case.to_dict(), rows, environment=env)
        for run, _ in runs.values():
            store.finish_run(run)
    return path


def _table_cells(table: str) -> dict[str, list[str]]:
    """backend -> its line's cells (split on runs of two spaces and more)."""
    lines = [line for line in table.splitlines() if line.startswith("attention ")]
    return {line.split()[1]: [c.strip() for c in line.split("  ") if c.strip()] for line in lines}


def test_the_bench_table_shows_rate_and_share(tmp_path: Path) -> None:
    store = _planted_store(tmp_path / "zoo.sqlite")
    with ResultStore(store) as s:
        table = comparison_table(group_cases(s.rows()), reference="sdpa")
    header = table.splitlines()[0]
    assert RATE_HEADER in header and SHARE_HEADER in header
    cells = _table_cells(table)
    for backend, (rate, share) in EXPECTED.items():
        at = cells[backend].index(rate)
        assert cells[backend][at + 1] == share, cells[backend]
    assert f"{SHARE_HEADER} {PEAK_UNKNOWN} on {CPU_NAME}" in table
    assert OVER_PEAK not in table


def test_a_share_above_the_peak_is_explained() -> None:
    config = BenchCase(target="attention", backend="sdpa", seq_len=8, device="cuda",
                       dtype="bfloat16").to_dict()  # fmt: skip
    case = {"config": config, "status": "ok", "error": None, "threads": 1, "device_name": H100,
            "metrics": {"flops": 2e13, "time_median": 1e-2}}  # fmt: skip
    table = comparison_table([case], reference=None)
    assert "202.1%" in table and OVER_PEAK in table


def test_results_derives_rate_rows_in_csv_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = str(_planted_store(tmp_path / "zoo.sqlite"))
    assert main(["results", "--store", store, "--run-id", "all", "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    backend = {r["case_key"]: json.loads(r["config"])["backend"] for r in rows}
    rate = {backend[r["case_key"]]: float(r["value"]) for r in rows if r["metric"] == FLOP_RATE}
    assert rate == pytest.approx({"sdpa": 5e14, "full": 2e13, "local": 3e10})
    share = {backend[r["case_key"]]: r for r in rows if r["metric"] == PEAK_SHARE}
    assert set(share) == {"sdpa", "full"}  # the CPU case has no peak
    assert float(share["sdpa"]["value"]) == pytest.approx(5e14 / 989.4e12)
    assert "H100 SXM bfloat16: 989.4 TFLOP/s" in share["sdpa"]["unit"]
    assert "float32: 66.9 TFLOP/s dense (CUDA cores)" in share["full"]["unit"]
    assert main(["results", "--store", store, "--format", "json", "--metric", PEAK_SHARE]) == 0
    assert {d["metric"] for d in json.loads(capsys.readouterr().out)} <= {PEAK_SHARE}
    assert main(["results", "--store", store, "--run-id", "all"]) == 0
    table = capsys.readouterr().out
    assert RATE_HEADER in table and "50.5%" in table


@pytest.mark.slow
def test_the_report_shows_rate_and_share_traced_to_the_store(tmp_path: Path) -> None:
    pytest.importorskip("pandas")
    from attention_zoo.report import cost
    from attention_zoo.report.builder import select
    from attention_zoo.report.document import Document, to_markdown
    from attention_zoo.report.ledger import config_value, recompute

    path = _planted_store(tmp_path / "zoo.sqlite")
    with ResultStore(path) as store:
        rows, runs = store.rows(), store.runs()
    ctx = select(rows, runs)
    markdown = to_markdown(Document("t", cost.headline(ctx)))
    assert f"| {RATE_HEADER} | {SHARE_HEADER} |" in markdown
    for rate, share in EXPECTED.values():
        assert f"| {rate} | {share} |" in markdown
    stored = {(r["run_id"], r["case_key"], r["metric"]): r for r in rows}

    def fetch(ref):
        row = stored[tuple(ref)] if not ref[2].startswith("config.") else None
        config = json.loads(next(r for r in rows if r["case_key"] == ref[1])["config"])
        return config, (row["value"] if row else float(config_value(config, ref[2])))

    shares = [e for e in ctx.ledger.entries if e.formula == "peak_share"]
    assert {e.text for e in shares} == {"50.5%", "29.9%"}
    assert all(recompute(e, fetch) == e.text for e in ctx.ledger.entries)


@pytest.mark.gpu
def test_on_cuda_bench_shows_a_share_of_the_gpu_s_peak(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bfloat16 SDPA case measured on this GPU: the environment records TF32 off (torch's
    default, kept by the zoo), the rate is positive and, on a GPU of the peak table, its share is
    a percentage below the peak."""
    store = str(tmp_path / "gpu.sqlite")
    grid = "--target attention --backends sdpa --devices cuda --dtypes bfloat16 --lengths 4096"
    measure = "--modes forward+backward --metrics time,flops --budget 0.2 --no-progress"
    argv = ["bench", *grid.split(), *measure.split(), "--store", store]
    assert main(argv) == 0
    table = capsys.readouterr().out
    with ResultStore(store) as s:
        (case,) = group_cases(s.rows())
    assert json.loads(case["environment"])["cuda_matmul_tf32"] is False
    found = case_throughput(case)
    assert found is not None and found.flops_per_s > 0
    if match_device(case["device_name"]) is None:
        assert f"{SHARE_HEADER} {PEAK_UNKNOWN} on {case['device_name']}" in table
        pytest.skip(f"{case['device_name']} is not in the peak table")
    assert 0 < found.share < 1
    assert format_percent(found.share) in _table_cells(table)["sdpa"]
