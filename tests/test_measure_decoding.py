"""Generation measured like everything else: prefill and decode cases (`zoo bench --modes
prefill,decode`), their state bytes and trust marks, the grid and the command line."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from attention_zoo.attention.decode import StateShape
from attention_zoo.attention.spec import build_attention
from attention_zoo.cli import main
from attention_zoo.errors import ConfigError
from attention_zoo.measure.cases import BenchCase, build_runnable, case_key
from attention_zoo.measure.runner import MeasureSettings, measure_case
from attention_zoo.store import ResultStore
from attention_zoo.sweep import SweepGrid

from .decoding_fixtures import make_decode_store

FAST = MeasureSettings(time_budget_s=0.0, min_repeats=3, metrics=("time", "memory"))


def _decode(backend: str, mode: str = "decode", **changes) -> BenchCase:
    fields = {"target": "attention", "backend": backend, "seq_len": 96, "num_heads": 2}
    return BenchCase(**{**fields, "mode": mode, "new_tokens": 4, "head_dim": 16, **changes})


def test_cases_that_do_not_generate_keep_their_keys():
    case = BenchCase(backend="lsh", seq_len=512)
    data = case.to_dict()
    for name in ("label", "note", "peer", "new_tokens", "decoder"):
        data.pop(name)
    assert case.key() == case_key(data)
    assert _decode("sdpa").key() != _decode("sdpa", decoder="recompute").key()


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"target": "block"}, "target 'attention'"),
        ({"causal": False}, "causal=true"),
        ({"new_tokens": 0}, "new_tokens >= 1"),
        ({"mode": "forward"}, "use mode prefill or decode"),
        ({"decoder": "cache"}, "own, recompute"),
    ],
)
def test_a_generation_case_says_what_would_work(changes, words):
    with pytest.raises(ConfigError, match=words):
        _decode("sdpa", **changes)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sdpa", "local", "linear", "lsh"])
def test_decode_cases_store_time_per_token_and_state_bytes(backend):
    """One token per timed call, its output checked ((b, h, 1, d)); the state's bytes per
    sequence are its backend's formula (batch 2: half the state)."""
    case = _decode(backend, batch=2)
    result = measure_case(case, FAST)
    assert result.status == "ok", result.error
    core = build_attention(backend, causal=True, device="cpu")
    formula = core.state_bytes(StateShape(2, 2, 16, 96 + 4))
    assert result.value("state_bytes") == formula / 2
    assert result.value("time_median") > 0 and result.value("time_repeats") >= 3


def test_a_decode_case_keeps_decoding_at_its_context():
    """After new_tokens tokens the state is the prefilled one again: any number of timed calls
    decodes at contexts seq_len .. seq_len + new_tokens."""
    for backend in ("sdpa", "local"):  # a KV cache (appends) and a window (copied back)
        runnable = build_runnable(_decode(backend))
        lengths = []
        for _ in range(10):
            runnable.step()
            lengths.append(runnable.state().length)
        assert lengths == [97, 98, 99, 100, 97, 98, 99, 100, 97, 98]


@pytest.mark.slow
def test_prefill_and_recompute_cases_and_a_refusal():
    prefill = measure_case(_decode("linear", "prefill"), FAST)
    assert prefill.status == "ok" and prefill.value("state_bytes") > 0
    again = measure_case(_decode("sdpa", decoder="recompute"), FAST)
    assert again.status == "ok" and again.value("state_bytes") > 0
    refused = measure_case(_decode("nystrom"), FAST)
    assert refused.status == "skipped" and "bidirectional" in refused.error


def test_the_grid_measures_cores_causally_and_recomputes_only_decoding():
    grid = SweepGrid(
        backends=("sdpa",),
        seq_lens=(64,),
        modes=("forward", "prefill", "decode"),
        causal=(False,),
        new_tokens=8,
        decoders=("own", "recompute"),
    )
    cases = {(c.mode, c.decoder): c for c in grid.cases()}
    assert set(cases) == {
        ("forward", "own"),
        ("prefill", "own"),
        ("decode", "own"),
        ("decode", "recompute"),
    }
    assert cases[("forward", "own")].target == "block"
    for mode, decoder in [("prefill", "own"), ("decode", "own"), ("decode", "recompute")]:
        case = cases[(mode, decoder)]
        assert case.target == "attention" and case.causal and case.new_tokens == 8
    assert cases[("decode", "recompute")].label == "sdpa (recompute)"
    with pytest.raises(ConfigError, match=r"ReformerLM\.generate"):
        SweepGrid(target="model", modes=("decode",))


@pytest.mark.slow
def test_zoo_bench_measures_generation(tmp_path, capsys):
    store = tmp_path / "s.sqlite"
    code = main(
        [
            "bench", "--target", "attention", "--backends", "sdpa", "--lengths", "64",
            "--modes", "prefill,decode", "--new-tokens", "4", "--decoders", "own,recompute",
            "--budget", "0", "--metrics", "time,memory", "--store", str(store), "--no-progress",
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "decode" in out and "sdpa (recompute)" in out
    with ResultStore(store) as s:
        rows = s.rows()
    states = {r["case_key"] for r in rows if r["metric"] == "state_bytes" and r["value"] > 0}
    assert len(states) == 3  # a prefill, its own decoding, recomputing
    assert main(["bench", "--modes", "decode", "--new-tokens", "0", "--dry-run"]) == 2


def _targets_script():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "scripts" / "decoding_targets.py"
    spec = importlib.util.spec_from_file_location("decoding_targets", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_targets_script_judges_a_run_and_never_a_busy_one(tmp_path, capsys):
    """On known laws: the flat ones pass, sdpa's exponent 1.00 passes, recomputing at 16384 is
    1638x; a performer and a sliding window not measured, and a busy run, decide nothing."""
    script = _targets_script()
    assert script.main(["--store", str(make_decode_store(tmp_path / "idle.sqlite"))]) == 0
    out = capsys.readouterr().out
    assert "linear: time per token at the longest context <= 1.2x the shortest: PASS" in out
    assert "PASS: exponent 1.000" in out and "PASS: 1638.4x per token" in out
    assert "performer: time per token at the longest context <= 1.2x the shortest: UNDECIDED" in out
    busy = make_decode_store(tmp_path / "busy.sqlite", busy=True)
    assert script.main(["--store", str(busy)]) == 0
    out = capsys.readouterr().out
    assert "PASS" not in out and out.count("UNDECIDED: times set aside") == 4


def test_the_targets_script_refuses_a_store_with_nothing_to_judge(tmp_path, capsys):
    script = _targets_script()
    ResultStore(tmp_path / "empty.sqlite").close()
    for extra in ([], ["--run-id", "nope"]):
        assert script.main(["--store", str(tmp_path / "empty.sqlite"), *extra]) == 2
        assert "holds no run" in capsys.readouterr().err


@pytest.mark.parametrize(("time_ratio", "verdict"), [(0.9, "PASS"), (1.3, "FAIL")])
def test_the_targets_script_judges_one_kv_head_beside_four(tmp_path, capsys, time_ratio, verdict):
    """sdpa with kv_heads=1 beside sdpa at the longest context both have: its state a quarter,
    its time per token not above; the plain series' other targets keep to the plain rows."""
    script = _targets_script()
    with ResultStore(tmp_path / "s.sqlite") as store:
        run = store.start_run(kind="bench", device="cpu")
        plain = {"kv_heads": 4}  # the default, as `--option sdpa.kv_heads=1,4` writes it
        shared = {"kv_heads": 1}
        for options, time, state in ((plain, 1e-3, 4096), (shared, time_ratio * 1e-3, 1024)):
            for n in (1024, 65536):
                case = BenchCase(
                    target="attention", backend="sdpa", seq_len=n, mode="decode", new_tokens=8,
                    options=options,
                )  # fmt: skip
                rows = [("time_median", time, "s"), ("time_iqr", time / 50, "s")]
                rows += [("time_min", time, "s"), ("state_bytes", state * n + 1040, "bytes")]
                store.add_rows(run, None, case.to_dict(), rows)
        store.finish_run(run)
        store._db.execute("UPDATE runs SET load_start = 0.0, load_end = 0.0, cpu_count = 2")
        store._db.commit()
    assert script.main(["--store", str(tmp_path / "s.sqlite")]) == (verdict == "FAIL")
    out = capsys.readouterr().out
    assert f"state 1/4, time per token not above: {verdict}: at L=65536 state 0.250x" in out
    assert f"time {time_ratio:.3f}x" in out
