"""approx_error: the relative error of approximate backends against the dense reference, measured
by the runner, stored, shown in the bench table and in the report's Fidelity x cost section."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pandas as pd
import pytest
import torch

from attention_zoo.attention.base import AttentionCore
from attention_zoo.attention.spec import BACKENDS, Capabilities, register_attention
from attention_zoo.measure.cases import BenchCase
from attention_zoo.measure.fidelity import (
    NOT_MEASURED,
    PEAK_GROUP,
    is_approximate,
    measure_fidelity,
    peaked_inputs,
    relative_error,
)
from attention_zoo.measure.metrics import FIDELITY_INPUTS, METRICS, approx_error_name
from attention_zoo.measure.runner import MeasureSettings
from attention_zoo.measure.table import comparison_table, group_cases
from attention_zoo.report.builder import build_report
from attention_zoo.report.context import Context
from attention_zoo.report.fidelity import fidelity_cost
from attention_zoo.store import ResultStore
from attention_zoo.sweep import run_sweep

ERRORS = [approx_error_name(inputs) for inputs in FIDELITY_INPUTS]
SMALL = {"num_heads": 2, "head_dim": 32}  # small cores: every comparison takes milliseconds


def small(backend: str, n: int = 256, **changes) -> BenchCase:
    return BenchCase(backend=backend, seq_len=n, **{**SMALL, **changes})


def errors(case: BenchCase, limit: int | None = None) -> dict[str, float]:
    result = measure_fidelity(case, limit)
    assert result.note is None, result.note
    return {r.metric: r.value for r in result.rows}


def test_catalogue_has_one_deterministic_metric_per_input_family() -> None:
    for name in ERRORS:
        spec = METRICS[name]
        assert spec.group == "fidelity" and spec.deterministic and spec.column and spec.report


def test_exact_backends_are_not_compared() -> None:
    for backend in ("full", "sdpa", "shared-qk"):
        result = measure_fidelity(small(backend))
        assert result.rows == [] and result.note is None


@pytest.mark.parametrize("causal", [True, False])
def test_an_approximation_that_covers_the_sequence_has_no_error(causal: bool) -> None:
    """local with one chunk holding the whole sequence is full attention: error = rounding."""
    got = errors(small("local", 100, causal=causal, options={"chunk_length": 128}))
    assert set(got) == set(ERRORS)
    assert all(0 <= e < 1e-5 for e in got.values()), got


def test_a_backend_with_extra_inputs_is_compared_with_them() -> None:
    """nsa's gates come from the hidden states: the comparison draws them as the bench does."""
    result = measure_fidelity(small("nsa", options={"block_size": 16, "window": 32}))
    assert result.note is None and len(result.rows) == len(ERRORS)
    assert all(0 < r.value < 10 for r in result.rows)


def test_local_and_lsh_have_a_positive_error_and_lsh_is_closer_on_peaked_inputs() -> None:
    local, lsh = errors(small("local")), errors(small("lsh"))
    assert all(0.1 < e < 10 for e in [*local.values(), *lsh.values()]), (local, lsh)
    # a one-chunk window misses most of a causal query's near-uniform attention at 256 tokens
    assert local["approx_error_random"] < 1
    # LSH buckets the groups of peaked inputs together; on random inputs the few keys it sees
    # stand in badly for an average over all of them (measured 0.65 vs 2.0 at these settings)
    assert lsh["approx_error_peaked"] < 0.5 * lsh["approx_error_random"]


def test_the_error_is_deterministic_and_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(7)
    before = torch.get_rng_state()
    first = errors(small("lsh", 128))
    assert torch.equal(torch.get_rng_state(), before)
    assert errors(small("lsh", 128)) == first


def test_options_reach_the_backend() -> None:
    one, four = (
        errors(small("lsh", options={"num_hashes": 1})),
        errors(small("lsh", options={"num_hashes": 4})),
    )
    assert four["approx_error_peaked"] < one["approx_error_peaked"]


def test_a_block_is_compared_at_its_core() -> None:
    core, block = small("lsh", 128), small("lsh", 128, target="block")
    assert errors(block) == errors(core)


def test_model_cases_and_oversized_references_say_why_they_are_not_measured() -> None:
    model = measure_fidelity(small("local", 128, target="model"))
    assert model.rows == [] and model.note.startswith(NOT_MEASURED)
    tight = measure_fidelity(small("lsh", 1024), 2**20)
    assert tight.rows == []
    assert "shared-qk (the reference) is predicted to need" in tight.note
    assert "> limit 1.0 MiB" in tight.note


def test_peaked_inputs_concentrate_attention_on_each_group() -> None:
    q, k, _ = peaked_inputs((1, 1, 64, 32), torch.Generator().manual_seed(0))
    weights = (q @ k.transpose(-1, -2) / math.sqrt(32)).softmax(-1)
    top = weights.topk(PEAK_GROUP, dim=-1).values.sum(-1)
    assert top.min() > 0.99  # each query's group holds nearly all of its attention
    q, k = torch.randn(2, 1, 1, 64, 32)
    spread = (q @ k.transpose(-1, -2) / math.sqrt(32)).softmax(-1)
    assert spread.topk(PEAK_GROUP, dim=-1).values.sum(-1).mean() < 0.5


def test_relative_error_is_the_relative_frobenius_norm() -> None:
    ref = torch.tensor([[3.0, 4.0]])
    assert relative_error(ref, ref) == 0
    assert relative_error(torch.tensor([[3.0, 5.0]]), ref) == pytest.approx(1 / 5)


@dataclass(frozen=True, kw_only=True)
class _ProbeConfig:
    """Full attention, or declared approximate."""

    approximate: bool = False

    def capabilities(self, caps: Capabilities) -> Capabilities:
        return replace(caps, exact=not self.approximate)


def test_exactness_is_read_with_the_cases_options() -> None:
    @register_attention("fidelity-probe", config=_ProbeConfig, caps=Capabilities())
    class Probe(AttentionCore):
        """Full attention."""

        def attend(self, q, k, v, key_padding_mask):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.causal)

    try:
        assert not is_approximate(small("fidelity-probe"))
        case = small("fidelity-probe", 64, options={"approximate": True})
        assert is_approximate(case)
        assert all(e < 1e-5 for e in errors(case).values())
    finally:
        BACKENDS.remove("fidelity-probe")


@pytest.mark.slow
def test_the_runner_stores_the_error_and_the_table_shows_it(tmp_path) -> None:
    settings = MeasureSettings(metrics=("predict", "fidelity"))
    cases = [small("full", 128), small("local", 128), small("lsh", 1024)]
    limit = 6 * 2**20  # lsh's core at 1024 fits, the dense reference beside it does not
    with ResultStore(tmp_path / "s.sqlite") as store:
        result = run_sweep(
            cases, store, settings=settings, memory_limit_bytes=limit, progress=False
        )
        assert {r.status for r in result.results} == {"ok"}
        rows = group_cases(store.rows(result.run_id))
    by_backend = {c["config"]["backend"]: c for c in rows}
    assert not set(ERRORS) & set(by_backend["full"]["metrics"])
    local = measure_fidelity(small("local", 128))
    assert [by_backend["local"]["metrics"][e] for e in ERRORS] == [r.value for r in local.rows]
    assert not set(ERRORS) & set(by_backend["lsh"]["metrics"])
    assert "shared-qk (the reference) is predicted to need" in by_backend["lsh"]["error"]
    table = comparison_table(rows)
    assert "approx_error random" in table and "approx_error peaked" in table
    assert f"{by_backend['local']['metrics']['approx_error_peaked']:.4g}" in table
    assert NOT_MEASURED in table


def _report(tmp_path, cases, settings) -> str:
    with ResultStore(tmp_path / "s.sqlite") as store:
        run_sweep(cases, store, settings=settings, memory_limit_bytes=6 * 2**20, progress=False)
        files = build_report(store.to_dataframe(), tmp_path / "rep", runs=store.runs())
    return files.markdown.read_text()


@pytest.mark.slow
def test_report_section_with_data(tmp_path) -> None:
    settings = MeasureSettings(metrics=("time", "fidelity"), time_budget_s=0.0, min_repeats=1)
    cases = [small(b, n) for b in ("local", "lsh") for n in (64, 128)]
    text = _report(tmp_path, cases, settings)
    section = text.split("## Fidelity x cost", 1)[1].split("\n## ", 1)[0]
    assert "fidelity-1.png" in section and (tmp_path / "rep" / "fidelity-1.png").exists()
    table = [line for line in section.splitlines() if line.startswith("| ")][1:]
    assert len(table) == 4  # one line per case
    assert [line.split(" | ")[2] for line in table[:2]] == ["exact pattern", "approximate"]
    for inputs in FIDELITY_INPUTS:  # at each length, at least the best variant is on the front
        column = 4 if inputs == "random" else 5  # after L, variant, computes, time
        for n in (64, 128):
            cells = [line.split(" | ") for line in table if line.startswith(f"| {n} |")]
            assert any(c[column].strip(" |").endswith(" (front)") for c in cells), (inputs, cells)


@pytest.mark.slow
def test_report_section_explains_or_is_absent_without_data(tmp_path) -> None:
    settings = MeasureSettings(metrics=("predict", "fidelity"))
    text = _report(tmp_path / "a", [small("lsh", 1024)], settings)
    section = text.split("## Fidelity x cost", 1)[1].split("\n## ", 1)[0]
    assert "approx_error not measured: `shared-qk (the reference) is predicted" in section
    assert "fidelity-1.png" not in section
    text = _report(tmp_path / "b", [small("full", 64)], settings)
    assert "approx_error not measured: no approximate backend was measured" in text
    nothing = pd.DataFrame()
    assert fidelity_cost(Context(nothing, nothing, nothing, [], tmp_path)) == []


def test_asv_tracks_the_error_of_approximate_backends_only() -> None:
    from benchmarks import bench_fidelity

    bench = bench_fidelity.Fidelity()
    assert set(bench.params[0]) == set(BACKENDS.names())
    with pytest.raises(NotImplementedError, match="exact"):
        bench.setup("full", 1024)
    bench.setup("local", 64)
    assert (
        bench.track_approx_error_random()
        == errors(BenchCase(backend="local", seq_len=64))["approx_error_random"]
    )
