"""Everything registered is tracked: baselines, the asv suite and the report cover every backend,
residual variant and task, and a newly registered backend is picked up with no other edit."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from attention_zoo import AttentionCore, Capabilities, register_attention
from attention_zoo.attention.spec import BACKENDS
from attention_zoo.blocks.residual import RESIDUALS
from attention_zoo.measure import baseline
from attention_zoo.measure.cases import BenchCase
from attention_zoo.measure.metrics import METRICS
from attention_zoo.tasks.base import TASKS
from attention_zoo.tasks.suite import find_suite


def _asv(module: str):
    """benchmarks.<module> imported afresh, without the suite's import-time warm-up (not needed to
    read its parameters)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ZOO_ASV_NO_WARMUP", "1")
        return importlib.reload(importlib.import_module(f"benchmarks.{module}"))


def _baselined_backends() -> set[str]:
    return {b for c in baseline.baseline_cases() for b in c.backends()}


def _asv_backends() -> set[str]:
    bench = _asv("bench_attention")
    return {
        name
        for cls in (bench.Time, bench.Memory, bench.Prediction)
        for name in cls.params[cls.param_names.index("backend")]
    }


@dataclass(frozen=True, kw_only=True)
class _ProbeConfig:
    """No options."""


def test_a_registered_backend_is_baselined_and_benchmarked_with_no_other_edit() -> None:
    @register_attention("coverage-probe", config=_ProbeConfig, caps=Capabilities())
    class ProbeAttention(AttentionCore):
        """Full attention under another name."""

        def attend(self, q, k, v, key_padding_mask):
            return (q @ k.transpose(-1, -2)).softmax(-1) @ v

    try:
        assert "coverage-probe" in _baselined_backends()
        assert "coverage-probe" in _asv_backends()
    finally:
        BACKENDS.remove("coverage-probe")
    assert "coverage-probe" not in _asv_backends()


def test_every_backend_and_residual_is_baselined_and_benchmarked() -> None:
    assert _baselined_backends() == set(BACKENDS.names())
    assert _asv_backends() == set(BACKENDS.names())
    residuals = {c.model["residual"] for c in baseline.baseline_cases() if c.target == "model"}
    assert residuals == set(RESIDUALS.names())
    layers = _asv("bench_blocks").ResidualLayers
    residuals = layers.params[layers.param_names.index("residual")]
    assert set(residuals) == set(RESIDUALS.names())


def test_committed_baseline_holds_every_case_that_runs_on_cpu() -> None:
    stored = baseline.load()["cases"]
    missing = [
        c.name()
        for c in baseline.baseline_cases()
        if baseline.case_available(c) is None and c.key() not in stored
    ]
    assert not missing, (
        f"the committed baseline lacks {missing}; run python benchmarks/scripts/update_baselines.py"
    )


def test_asv_track_units_come_from_the_metric_catalogue() -> None:
    marked = 0
    for module in ("bench_attention", "bench_blocks", "bench_model", "bench_fidelity"):
        for cls in vars(_asv(module)).values():
            for name, method in vars(cls).items() if isinstance(cls, type) else ():
                if name.startswith("track_") and hasattr(method, "metric"):
                    assert method.unit == METRICS[method.metric].unit, (module, name)
                    marked += 1
    assert marked >= 6


def test_every_task_has_a_declarative_suite() -> None:
    for name in TASKS.names():
        assert find_suite(name).is_file()


@pytest.mark.slow
def test_report_shows_every_backend_of_the_store(tmp_path: Path) -> None:
    pytest.importorskip("pandas")
    from attention_zoo.report.builder import build_report
    from attention_zoo.store import ResultStore

    with ResultStore(tmp_path / "zoo.sqlite") as store:
        run_id = store.start_run(kind="bench", device="cpu")
        for name in BACKENDS.names():
            case = BenchCase(target="attention", backend=name, seq_len=256)
            store.add_rows(run_id, case.key(), case.to_dict(), [("flops", 1e9, "flop")])
        frame = store.to_dataframe()
    text = build_report(frame, tmp_path / "report").markdown.read_text()
    for name in BACKENDS.names():
        assert f"`{name}`" in text, f"backend {name} missing from the report"


@pytest.mark.slow
@pytest.mark.parametrize("backend", sorted(BACKENDS.names()))
def test_the_padding_mask_benchmark_runs_every_backend_that_can_run_here(backend):
    bench = _asv("bench_attention").PaddingMask()
    threads = torch.get_num_threads()  # the benchmark's setup fixes its own thread count
    try:
        bench.setup("cpu", 1, backend, "forward+backward")
        bench.time_step()
        assert bench.track_peak_bytes() > 0
    except NotImplementedError as skip:  # asv's skip: shown as n/a
        pytest.skip(str(skip))
    finally:
        torch.set_num_threads(threads)


def test_padding_options_skip_a_backend_this_commit_lacks():
    common = _asv("common")
    assert common.padding_options("no-such-backend", 1024) == {}
    assert common.padding_options("lsh", 1024) == {"max_length": 1024}
    assert common.padding_options("full", 1024) == {}
