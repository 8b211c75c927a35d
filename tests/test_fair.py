"""The fair-comparison numbers as a run stores and a report reads them: each case's parameters,
decoding state and FLOPs per token at its own setting, and `zoo report --equal` keeping only the
variants that hold the reference's."""

from __future__ import annotations

from pathlib import Path

import pytest

from attention_zoo.attention import nsa
from attention_zoo.attention.kernels.recurrences import delta
from attention_zoo.cli import main
from attention_zoo.measure import fair
from attention_zoo.measure.cases import BenchCase
from attention_zoo.measure.fair import FairSetting, fair_numbers
from attention_zoo.measure.predict import predict_flops
from attention_zoo.measure.runner import MeasureSettings, measure_case
from attention_zoo.measure.status import OK, TIMEOUT

FAIR = ("block_parameters", "state_bytes_per_sequence", "flops_per_token")


def _case(backend: str, **options) -> BenchCase:
    return BenchCase(target="attention", backend=backend, seq_len=128, options=options)


@pytest.mark.slow
def test_a_case_stores_its_fair_numbers_at_its_own_setting():
    case = _case("sdpa", kv_heads=1)
    result = measure_case(case, MeasureSettings(metrics=("predict", "flops")))
    assert result.status == OK
    want = fair_numbers("sdpa", {"kv_heads": 1}, FairSetting.of(case))
    assert [result.value(m) for m in FAIR] == [
        want.params,
        want.state_bytes,
        want.flops_per_token,
    ]


@pytest.mark.slow
def test_a_case_refused_by_its_predicted_time_stores_no_fair_numbers():
    settings = MeasureSettings(metrics=("predict", "flops", "time"), time_limit_s=1e-9)
    result = measure_case(_case("sdpa"), settings)
    assert result.status == TIMEOUT and "not run: predicted" in result.error
    assert not {r.metric for r in result.rows} & set(FAIR)


@pytest.mark.slow
def test_zoo_report_equal_keeps_the_variants_at_the_references_state(tmp_path: Path):
    store, out = tmp_path / "s.sqlite", tmp_path / "report"
    bench = ["bench", "--target", "attention", "--backends", "sdpa,full,retention"]
    bench += ["--lengths", "64", "--metrics", "predict,flops", "--store", str(store)]
    assert main([*bench, "--no-progress"]) == 0
    report = ["report", "--store", str(store), "--reference", "sdpa"]
    assert main([*report, "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    assert "# Fair comparison" in text and "`retention`" in text
    assert "At `sdpa`'s state: `full`." in text  # retention's state: a constant, not a KV cache
    assert main([*report, "--equal", "state", "--out", str(out / "equal")]) == 0
    fair = (out / "equal" / "report.md").read_text().split("# Fair comparison")[1]
    assert "`full`" in fair and "`retention`" not in fair
    summary = (out / "equal" / "summary.md").read_text()
    assert "Held equal (`--equal state`)" in summary and ", 2 of 3 (0 lack the number)" in summary
    # a filter that keeps nothing is refused in one line, nothing written
    bare = tmp_path / "bare.sqlite"
    bench = [a if a != "predict,flops" else "memory" for a in bench[:-1]] + [str(bare)]
    assert main([*bench, "--no-progress"]) == 0
    argv = ["report", "--store", str(bare), "--equal", "params", "--out", str(out / "none")]
    assert main(argv) == 2 and not (out / "none").exists()


def _extended(case: BenchCase, monkeypatch: pytest.MonkeyPatch) -> int:
    """forward_flops(case), asserting it extended shorter counts rather than counting the case."""
    counted: list[int] = []

    def spy(sample: BenchCase) -> int:
        counted.append(sample.seq_len)
        return predict_flops(sample)

    monkeypatch.setattr(fair, "predict_flops", spy)
    flops = fair.forward_flops(case)
    monkeypatch.setattr(fair, "predict_flops", predict_flops)
    assert counted and case.seq_len not in counted
    return flops


def _node_from(length: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """nsa's three branches in one node from `length` positions on (at real sizes: 16k here)."""
    monkeypatch.setattr(nsa, "pays", lambda rows, n, value_dim: n >= length)


def _shrunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """forward_flops' lengths scaled down, so the extension runs in a quick test."""
    monkeypatch.setattr(fair, "COUNTED_UP_TO", 2048)
    monkeypatch.setattr(fair, "PERIOD", 256)
    monkeypatch.setattr(fair, "SAMPLED_FROM", 1024)


@pytest.mark.slow
@pytest.mark.parametrize(
    "backend, options",
    [(name, {}) for name in ("retention", "gla", "deltanet", "gated-deltanet")]
    + [("gla", {"gate": "vector"}), ("gated-deltanet", {"negative_eigenvalues": True})],
)
def test_a_recurrence_s_flops_past_the_counted_lengths_equal_a_direct_count(
    backend: str, options: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    _shrunk(monkeypatch)
    case = BenchCase(target="block", backend=backend, options=options, seq_len=3000)
    assert _extended(case, monkeypatch) == predict_flops(case)


@pytest.mark.slow
@pytest.mark.parametrize(
    "backend, options",
    [
        ("moba", {}),
        ("moba", {"top_k": 3, "kv_heads": 1}),
        ("nsa", {}),
        ("nsa", {"window": 100, "num_selected": 5}),
    ],
)
def test_a_routed_backend_s_flops_past_the_counted_lengths_equal_a_direct_count(
    backend: str, options: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    _shrunk(monkeypatch)
    _node_from(1024, monkeypatch)  # nsa's branches share its tiles at the samples, as at 16k
    case = BenchCase(target="block", backend=backend, options={**options, "block_size": 32})
    case = case.replace(options={**case.options, "kernel": "tiled"}, seq_len=3000)
    assert _extended(case, monkeypatch) == predict_flops(case)


@pytest.mark.slow
@pytest.mark.parametrize(
    "backend, options, node_from",
    [
        # the window on its own kernel at the samples, on the tiles at the case's length
        ("nsa", {"block_size": 32}, 2500),
        # routes still filling at the samples (fewer blocks than slots)
        ("moba", {"block_size": 128, "top_k": 18}, None),
        ("nsa", {"block_size": 128, "num_selected": 20}, None),
    ],
)
def test_a_routed_count_that_changes_past_its_samples_is_counted_directly(
    backend: str, options: dict, node_from: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    _shrunk(monkeypatch)
    if node_from is not None:
        _node_from(node_from, monkeypatch)
    options = {**options, "kernel": "tiled"}
    case = BenchCase(target="block", backend=backend, options=options, seq_len=3008)
    counted: list[int] = []

    def spy(sample: BenchCase) -> int:
        counted.append(sample.seq_len)
        return predict_flops(sample)

    monkeypatch.setattr(fair, "predict_flops", spy)
    assert fair.forward_flops(case) == predict_flops(case)
    assert counted == [3008]  # refused before sampling, not by a check that happened to fail


@pytest.mark.parametrize(
    "shape, options, plan",
    [
        ((4, 64), {}, (2, fair.SAMPLED_FROM)),
        ((4, 64), {"kv_heads": 1}, (2, fair.SAMPLED_FROM)),  # the node counts query heads
        ((1, 8), {}, (2, 16 * fair.SAMPLED_FROM)),  # the node from 196,608 on: samples there
        ((4, 64), {"kernel": "gathered"}, None),  # not its tiles
    ],
)
def test_nsa_s_samples_start_where_its_branches_share_the_tiles(shape, options, plan) -> None:
    heads, head_dim = shape
    options = {"kernel": "tiled", **options}
    case = BenchCase(target="block", backend="nsa", options=options, seq_len=1 << 20)
    case = case.replace(num_heads=heads, head_dim=head_dim, hidden=heads * head_dim)
    assert fair._polynomial(case) == plan


@pytest.mark.slow
def test_a_routed_backend_is_counted_on_its_tiles_not_its_dense_reference():
    """Its math is every query against every key, masked: not what the mechanism costs."""
    setting = FairSetting(context=2048)
    for backend in ("moba", "nsa"):
        flops = fair_numbers(backend, {}, setting).flops_per_token
        tiles = fair_numbers(backend, {"kernel": "tiled"}, setting).flops_per_token
        dense = fair_numbers(backend, {"kernel": "math"}, setting).flops_per_token
        assert flops == tiles < dense / 2
    full = fair_numbers("full", {}, setting).flops_per_token  # math: the mechanism itself
    assert full == fair_numbers("full", {"kernel": "math"}, setting).flops_per_token


def test_only_a_count_known_to_be_a_polynomial_is_extended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _shrunk(monkeypatch)
    counted: list[int] = []

    def quadratic(case: BenchCase) -> int:  # no recurrence's: a count that bends
        counted.append(case.seq_len)
        return case.seq_len**2

    monkeypatch.setattr(fair, "predict_flops", quadratic)
    assert fair.forward_flops(BenchCase(backend="retention", seq_len=3000)) == 3000**2
    assert counted == [1024 + 3000 % 256 + i * 256 for i in range(3)] + [3000]
    counted.clear()
    assert fair.forward_flops(BenchCase(backend="sdpa", seq_len=3000)) == 3000**2
    assert counted == [3000]  # not a recurrence: counted directly
    counted.clear()
    assert fair.forward_flops(BenchCase(backend="retention", seq_len=2048)) == 2048**2
    assert counted == [2048]  # up to COUNTED_UP_TO: counted directly
    counted.clear()
    tiles = BenchCase(backend="moba", seq_len=3000, options={"kernel": "tiled"})
    assert fair.forward_flops(tiles) == 3000**2
    assert counted == [1024 + 3000 % 256 + i * 256 for i in range(4)]  # a quadratic, checked
    for options in ({"kernel": "tiled", "block_size": 48}, {"kernel": "gathered"}):
        counted.clear()  # blocks that do not divide the period, not its tiles: counted directly
        assert fair.forward_flops(tiles.replace(options=options)) == 3000**2
        assert counted == [3000]
    monkeypatch.setattr(fair, "predict_flops", lambda case: case.seq_len**3)
    assert fair.forward_flops(tiles) == 3000**3  # bends more


@pytest.mark.slow
def test_a_chunk_longer_than_the_period_is_counted_directly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Samples PERIOD apart would all be the same few chunks: a line through them misses the
    chunks past them."""
    _shrunk(monkeypatch)
    for backend in ("retention", "gla"):
        options = {"chunk_length": 4 * fair.PERIOD}
        case = BenchCase(target="block", backend=backend, options=options, seq_len=3000)
        assert fair.forward_flops(case) == predict_flops(case)


def test_the_samples_are_past_the_kernels_length_thresholds() -> None:
    assert delta._segment_length(fair.SAMPLED_FROM) == delta._segment_length(1 << 30)


@pytest.mark.slow
@pytest.mark.long
def test_a_recurrence_s_flops_at_the_real_lengths_equal_a_direct_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The constants as they are, with a remainder whose last segment's chunks are shorter where
    the segment length is."""
    n = fair.COUNTED_UP_TO + fair.PERIOD + 520
    case = BenchCase(target="block", backend="gated-deltanet", seq_len=n)
    assert _extended(case, monkeypatch) == predict_flops(case)
