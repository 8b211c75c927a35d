"""Peers (transformers, reformer-pytorch): measured by the same runner as our backends, grids give
them our settings, a missing package is a skipped row, ratio tables pair each case with its peer."""

from __future__ import annotations

import pytest

from attention_zoo.attention.spec import get_backend
from attention_zoo.errors import OptionError, UnknownNameError
from attention_zoo.measure import runner, trust
from attention_zoo.measure.cases import BenchCase, build_runnable, comparison_key
from attention_zoo.measure.peers import (
    PEERS,
    PeerSpec,
    peer_note,
    reference_backend,
    select_peers,
)
from attention_zoo.measure.runner import MeasureSettings, measure_case
from attention_zoo.measure.table import comparison_table, group_cases
from attention_zoo.report.fair import FAIR
from attention_zoo.store import ResultStore
from attention_zoo.sweep import SweepGrid, run_sweep

SMALL = {"hidden": 32, "num_heads": 2, "head_dim": 16, "seq_len": 128}
OPTIONS = {"chunk_length": 32, "num_hashes": 2, "seed": 0}
QUICK = MeasureSettings(
    metrics=("time", "memory", "predict", "flops"), time_budget_s=0.0, min_repeats=2, warmup=1
)


def installed(name: str) -> bool:
    return PEERS.get(name).version() is not None


needs_hf = pytest.mark.skipif(not installed("hf:lsh"), reason="transformers is not installed")
needs_lucid = pytest.mark.skipif(
    not installed("lucid:lsh"), reason="reformer-pytorch is not installed"
)


def case(backend: str, **changes) -> BenchCase:
    if backend in PEERS:
        options = PEERS.get(backend).inherit(OPTIONS)
    else:
        options = {k: v for k, v in OPTIONS.items() if k in get_backend(backend).defaults()}
    return BenchCase(
        target="block", backend=backend, mode="forward+backward", options=options, **SMALL
    ).replace(**changes)


def test_families_bring_the_peers_of_the_backends_measured() -> None:
    assert select_peers(["hf"], ["lsh"]) == ["hf:lsh"]
    assert select_peers(["hf", "lucid"], ["lsh", "local", "full"]) == [
        "hf:lsh",
        "hf:local",
        "lucid:lsh",
        "lucid:local",
    ]
    assert select_peers(["hf:local"], ["lsh"]) == ["hf:local"]  # named explicitly: taken
    with pytest.raises(
        UnknownNameError,
        match=r"unknown peer or peer family 'hugging'; known peer or peer families: hf",
    ):
        select_peers(["hugging"], ["lsh"])


def test_grid_gives_peers_the_options_of_the_backend_they_mirror() -> None:
    grid = SweepGrid(
        backends=("lsh",),
        peers=("hf", "lucid"),
        seq_lens=(128,),
        options={"lsh": {**OPTIONS, "num_hashes": [1, 2], "kernel": "math"}},
    )
    cases = grid.cases()
    by_backend: dict[str, list[BenchCase]] = {}
    for c in cases:
        by_backend.setdefault(c.backend, []).append(c)
    assert sorted(by_backend) == ["hf:lsh", "lsh", "lucid:lsh"]
    # the num_hashes axis reaches the peers; options they do not take (kernel, seed) do not
    assert [c.options for c in by_backend["hf:lsh"]] == [
        {"chunk_length": 32, "num_hashes": 1, "seed": 0},
        {"chunk_length": 32, "num_hashes": 2, "seed": 0},
    ]
    assert [c.options for c in by_backend["lucid:lsh"]] == [
        {"chunk_length": 32, "num_hashes": 1},
        {"chunk_length": 32, "num_hashes": 2},
    ]
    # peers are labelled as such in the stored config, and compare with our case
    hf = by_backend["hf:lsh"][0]
    assert hf.peer.startswith("transformers ") and hf.note == PEERS.get("hf:lsh").note
    assert hf.to_dict()["peer"] == hf.peer and peer_note(hf.to_dict()) == hf.note
    assert comparison_key(hf.to_dict()) == comparison_key(by_backend["lsh"][0].to_dict())
    assert by_backend["lsh"][0].peer == "" and by_backend["lsh"][0].note == ""


def test_our_case_keys_do_not_change_with_the_peer_fields() -> None:
    ours = BenchCase(backend="lsh", seq_len=128)
    data = ours.to_dict()
    assert data["peer"] == "" and data["note"] == ""
    # the fields added after keys were first stored (peers, generation) are left out at defaults
    added = ("peer", "note", "label", "new_tokens", "decoder")
    legacy = {k: v for k, v in data.items() if k not in added}
    from attention_zoo.measure.cases import case_key

    assert ours.key() == case_key(legacy)
    # a peer's version is part of its identity: another version is another case
    hf = case("hf:lsh")
    assert hf.key() != hf.replace(peer="transformers 0.0.1").key()


def test_peer_option_errors_name_what_it_takes() -> None:
    with pytest.raises(OptionError, match=r"peer 'hf:local' does not take option.*'num_hashes'"):
        SweepGrid(backends=("hf:local",), options={"hf:local": {"num_hashes": 2}}).cases()


@pytest.mark.slow
def test_a_missing_package_is_a_skipped_row_never_a_crash(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(PeerSpec, "version", lambda self: None)
    cases = SweepGrid(
        backends=("local",),
        peers=("hf", "lucid"),
        seq_lens=(64,),
        hidden=32,
        num_heads=2,
        head_dim=16,
        options={"local": {"chunk_length": 32}},
    ).cases()
    with ResultStore(tmp_path / "s.sqlite") as store:
        result = run_sweep(
            cases, store, settings=MeasureSettings(metrics=("predict",)), progress=False
        )
        stored = {c["config"]["backend"]: c for c in store.cases(result.run_id)}
    assert sorted(stored) == ["hf:local", "local", "lucid:local"]  # the peers of local only
    assert stored["hf:local"]["status"] == "skipped"
    assert stored["hf:local"]["error"] == "transformers is not installed (pip install transformers)"
    assert stored["hf:local"]["config"]["peer"] == "transformers (not installed)"
    assert stored["local"]["status"] == "ok"
    lucid = measure_case(case("lucid:lsh"), QUICK)
    assert lucid.status == "skipped" and "pip install reformer-pytorch" in lucid.error


@pytest.mark.slow
def test_peers_run_at_target_block_only() -> None:
    result = measure_case(case("hf:local").replace(target="attention"), QUICK)
    assert result.status == "skipped" and "target 'block' only" in result.error


@pytest.mark.slow
@needs_lucid
def test_lucid_length_limit_is_a_skip_reason() -> None:
    result = measure_case(case("lucid:lsh", seq_len=96), QUICK)
    assert result.status == "skipped"
    assert "multiple of 2 x chunk_length (64); L=96" in result.error


@pytest.mark.slow
@pytest.mark.long
@needs_hf
@pytest.mark.parametrize("peer", ["hf:lsh", "hf:local"])
def test_peer_is_measured_by_the_same_runner_with_the_same_metrics(monkeypatch, peer) -> None:
    calls: list[tuple[str, str]] = []
    real_peak, real_time = runner.profiled_peak, runner.time_until_stable

    def spy_peak(fn):
        calls.append(("profiled_peak", current[0]))
        return real_peak(fn)

    def spy_time(fns, **kw):
        calls.append(("time_until_stable", current[0]))
        return real_time(fns, **kw)

    monkeypatch.setattr(runner, "profiled_peak", spy_peak)
    monkeypatch.setattr(runner, "time_until_stable", spy_time)
    mirror = PEERS.get(peer).mirrors
    results = {}
    current = [""]
    for backend in (mirror, peer):
        current[0] = backend
        results[backend] = measure_case(case(backend), QUICK)
    assert [r.status for r in results.values()] == ["ok", "ok"], [r.error for r in results.values()]
    # free_cores is stored only for a timing long enough to read the load over (load.MIN_WINDOW_S)
    metrics = [{r.metric for r in results[b].rows} - {"free_cores"} for b in (peer, mirror)]
    fair = set(FAIR)  # a block's fair-comparison numbers: computed for our backends only
    assert metrics[0] - fair == metrics[1] - fair
    assert calls == [
        ("profiled_peak", mirror),
        ("time_until_stable", mirror),
        ("profiled_peak", peer),
        ("time_until_stable", peer),
    ]
    built = build_runnable(case(peer))
    assert type(built.module).__module__ == "attention_zoo.measure.peers.hf"  # HF module + out proj
    x = built.inputs[0]
    assert built.module(x).shape == x.shape


@pytest.mark.slow
@needs_hf
def test_interleaved_sweep_times_compared_cases_together(monkeypatch, tmp_path) -> None:
    groups: list[list[str]] = []
    real = runner.time_until_stable

    def spy(fns, **kw):
        groups.append(sorted(map(str, fns)))
        return real(fns, **kw)

    monkeypatch.setattr(runner, "time_until_stable", spy)
    # two repeats of a 64-token case: their spread is the machine's, not what this test checks
    monkeypatch.setattr(trust, "UNSTABLE_IQR", float("inf"))
    monkeypatch.setattr(trust, "UNSTABLE_MIN", 0.0)
    cases = SweepGrid(
        backends=("local",),
        peers=("hf",),
        seq_lens=(64, 128),
        hidden=32,
        num_heads=2,
        head_dim=16,
        options={"local": {"chunk_length": 32}},
    ).cases()
    settings = MeasureSettings(metrics=("time",), time_budget_s=0.0, min_repeats=2, interleave=True)
    with ResultStore(tmp_path / "s.sqlite") as store:
        result = run_sweep(cases, store, settings=settings, progress=False)
        rows = store.rows(result.run_id)
    assert groups == [["0", "1"], ["0", "1"]]  # per length: local and hf:local in one rotation
    repeats = [r["value"] for r in rows if r["metric"] == "time_repeats"]
    assert repeats == [2.0] * 4
    table = comparison_table(group_cases(rows), reference="hf")
    assert "time x hf" in table and "hf:local(chunk_length=32) (peer) [transformers 5" in table
    hf_lines = [line for line in table.splitlines() if line.startswith("block   hf:local")]
    assert len(hf_lines) == 2 and all(line.split()[-2:] == ["1.00x", "-"] for line in hf_lines)


def test_reference_family_resolves_to_the_peer_of_the_same_mechanism() -> None:
    assert reference_backend("hf", "lsh") == "hf:lsh"
    assert reference_backend("hf", "local") == "hf:local"
    assert reference_backend("hf", "lucid:lsh") == "hf:lsh"
    assert reference_backend("hf", "full") is None
    assert reference_backend("full", "lsh") == "full"


def test_vs_hf_preset_compares_like_with_like() -> None:
    from attention_zoo.presets import load_sweep_preset

    for name in ("vs-hf", "vs-hf-smoke"):
        preset = load_sweep_preset(name)
        assert preset.settings.interleave and preset.reference == "hf"
        groups: dict[str, set[str]] = {}
        for c in preset.grid.cases():
            groups.setdefault(comparison_key(c.to_dict()), set()).add(c.backend)
            if c.backend in PEERS:  # a peer runs with its mirror's settings
                mirror = PEERS.get(c.backend).mirrors
                assert c.options == PEERS.get(c.backend).inherit(preset.grid.options[mirror])
        expected = {"lsh", "local", "hf:lsh", "hf:local", "lucid:lsh"}
        assert all(backends == expected for backends in groups.values()), groups
