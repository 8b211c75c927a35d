"""The GPU targets script (benchmarks/scripts/gpu_targets.py) on a synthetic store of CUDA cases:
ratios to sdpa within a run pass or fail against their limits; a ratio between a captured case
and one that was not, a busy run's time and a missing case decide nothing."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from attention_zoo.measure.cases import BenchCase
from attention_zoo.store import ResultStore

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "scripts" / "gpu_targets.py"


def _script():
    spec = importlib.util.spec_from_file_location("gpu_targets", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _case(backend: str, n: int, mode: str = "forward+backward", **options) -> dict:
    case = BenchCase(
        backend=backend, seq_len=n, mode=mode, dtype="bfloat16", device="cuda",
        new_tokens=32 if mode == "decode" else 0, options=options,
    )  # fmt: skip
    return case.to_dict()


def _bidirectional(backend: str, n: int) -> dict:
    return {**_case(backend, n), "causal": False}


def _store(path: Path, cases: list[tuple[dict, float, float, bool]], *, busy: bool = False):
    with ResultStore(path) as store:
        run = store.start_run(kind="bench", device="cuda")
        for config, seconds, peak, on in cases:
            rows = [("time_median", seconds, "s"), ("time_iqr", seconds / 100, "s")]
            rows.append(("peak_bytes", peak, "bytes"))
            store.add_rows(run, None, config, rows, facts={"cuda_graphs": {"on": on}})
        store.finish_run(run)
        load = 40.0 if busy else 0.0
        store._db.execute("UPDATE runs SET load_start = ?, load_end = 0.0, cpu_count = 2", (load,))
        store._db.commit()
    return path


def test_targets_are_judged_within_a_run_and_captured_alike(tmp_path, capsys):
    script = _script()
    store = _store(
        tmp_path / "s.sqlite",
        [
            (_case("sdpa", 16384), 1.0e-3, 100.0, True),
            (_case("local", 16384), 0.4e-3, 120.0, True),  # 0.40x: passes 0.45x
            (_case("sdpa", 65536), 16e-3, 400.0, True),
            (_case("local", 65536), 2e-3, 300.0, False),  # not captured beside a captured sdpa
            (_case("lsh", 16384, num_hashes=4), 3.5e-3, 350.0, True),  # 3.5x: fails 3.0x
            (_bidirectional("nystrom", 16384), 0.5e-3, 90.0, True),  # no bidirectional sdpa
            (_case("sdpa", 65536, "decode"), 0.03e-3, 1.0, True),
            (_case("linear", 65536, "decode"), 0.04e-3, 1.0, False),
        ],
    )
    assert script.main(["--store", str(store)]) == 1  # a decided target failed
    out = capsys.readouterr().out
    assert "- local at 16384: time <= 0.45x sdpa: PASS: 0.400x (both captured)" in out
    assert "- local at 16384: peak <= 1.5x sdpa: PASS: 1.20x" in out
    assert "- local at 65536: time <= 0.08x sdpa: UNDECIDED: one of the two was captured" in out
    assert "- lsh(num_hashes=4) at 16384: time <= 3.0x sdpa: FAIL: 3.500x" in out
    assert "- lsh(num_hashes=4) at 16384: peak <= 3.0x sdpa: FAIL: 3.50x" in out
    assert "- bigbird at 16384: time <= 1.0x sdpa: UNDECIDED: not measured\n" in out
    alone = "- nystrom (bidirectional) at 16384: time <= 1.0x sdpa: UNDECIDED: not measured beside"
    assert f"{alone} sdpa in one run" in out
    assert "- sdpa decode at a 65536 context: <= 0.05 ms a token: PASS: 0.030 ms" in out
    assert "- linear decode at a 65536 context: <= 0.05 ms a token: UNDECIDED: not captured" in out


def test_a_busy_run_decides_no_time(tmp_path, capsys):
    script = _script()
    cases = [(_case("sdpa", 16384), 1e-3, 100.0, True), (_case("local", 16384), 9e-3, 100.0, True)]
    store = _store(tmp_path / "busy.sqlite", cases, busy=True)
    assert script.main(["--store", str(store)]) == 0
    out = capsys.readouterr().out
    assert "- local at 16384: time <= 0.45x sdpa: UNDECIDED: a number set aside" in out
    assert "- local at 16384: peak <= 1.5x sdpa: PASS: 1.00x" in out


def test_a_missing_store_is_refused_in_one_line(tmp_path, capsys):
    assert _script().main(["--store", str(tmp_path / "none.sqlite")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpu_targets.py: no results store at") and err.count("\n") == 1
