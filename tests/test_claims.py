"""The Reformer's claims: verdict rules on known ratios, the claims table from synthetic stores (and
'not measured' without rows), the smoke reproduction end to end with an interruption resumed."""

from __future__ import annotations

import pytest

from attention_zoo.cli import main as zoo
from attention_zoo.measure.cases import BenchCase, build_runnable
from attention_zoo.report.claims import CLAIM_COLUMNS, FAILS, HOLDS, NOT_MEASURED, WEAKER
from attention_zoo.reproduce import SIZES, claims_frame, get_reproduction
from attention_zoo.reproduce.reformer.claims import (
    CLAIM_TITLES,
    diagonal_ratio,
    monotone_score,
    verdict,
)
from attention_zoo.reproduce.reformer.experiments import experiments
from attention_zoo.reproduce.reformer.published import PUBLISHED, table2
from attention_zoo.store import ResultStore
from attention_zoo.tasks.results import SCORED_ON

MIB = 2**20


def claims_table(rows):
    return claims_frame(get_reproduction("reformer").claims(rows))


@pytest.mark.parametrize(
    ("rule", "ours", "published", "expected"),
    [
        ("saving", 0.50, 0.54, HOLDS),  # a larger saving than published
        ("saving", 0.54 * 1.25, 0.54, HOLDS),  # within the stated factor
        ("saving", 0.80, 0.54, WEAKER),  # same direction, weaker
        ("saving", 1.00, 0.54, FAILS),  # no saving at all
        ("saving", 2.30, 0.54, FAILS),
        ("no effect", 1.09, 1.01, HOLDS),
        ("no effect", 0.85, 1.01, FAILS),  # a gain where none was claimed
        ("match", 0.985, 0.999, HOLDS),
        ("match", 0.93, 0.999, WEAKER),
        ("match", 0.50, 0.999, FAILS),
        ("exact", 52.85, 52.85, HOLDS),
        ("exact", 52.0, 52.85, WEAKER),
        ("exact", 40.0, 52.85, FAILS),
        ("fits", 2, 2, HOLDS),
        ("fits", 1, 2, WEAKER),
        ("fits", 0, 2, FAILS),
        ("monotone", 2, 2, HOLDS),
        ("monotone", 1, 2, WEAKER),
        ("monotone", 0, 2, FAILS),
        ("saving", None, 0.54, NOT_MEASURED),
        ("saving", float("nan"), 0.54, NOT_MEASURED),
    ],
)
def test_verdict_rules(rule, ours, published, expected) -> None:
    assert verdict(rule, ours, published) == expected


def test_table2_pattern_of_the_paper() -> None:
    matrix = table2()
    assert monotone_score(matrix) == 2.0
    assert diagonal_ratio(matrix) == pytest.approx(0.999)
    matrix["lsh-2"]["lsh-4"] = 0.90  # lsh-2's row dips from 98.1% (2 hashes) to 90% (4)
    assert monotone_score(matrix) == 1.0  # most hashes still beat one hash
    matrix["lsh-2"]["lsh-8"] = 0.80  # now 80% with 8 hashes < 86.8% with 1
    assert monotone_score(matrix) == 0.0
    assert monotone_score({"shared-qk": {"full": 1.0}}) is None


def memory_case(store, run_id, label, bytes_, *, status="ok", metric="peak_total_bytes", **cfg):
    case = BenchCase(target="model", backend="full", label=label, **cfg)
    config = case.to_dict()
    store.add_rows(run_id, case.key() + label, config, [(metric, bytes_, "bytes")], status=status)


@pytest.fixture
def store(tmp_path):
    with ResultStore(tmp_path / "zoo.sqlite") as s:
        yield s


def test_claims_from_synthetic_rows(store) -> None:
    run = store.start_run(kind="bench")
    # claim a: local+lsh 100 MiB vs full 400 MiB at L=8192 (measured), sdpa only predicted
    for n, (lsh, full, sdpa) in {4096: (60, 150, 20), 8192: (100, 400, 40)}.items():
        memory_case(store, run, "reformer/cpu/a/local+lsh", lsh * MIB, seq_len=n)
        memory_case(store, run, "reformer/cpu/a/full", full * MIB, seq_len=n)
        memory_case(
            store, run, "reformer/cpu/a/sdpa", sdpa * MIB, seq_len=n, status="oom",
            metric="predicted_total_bytes",
        )  # fmt: skip
    # claim c: standard grows 40 MiB per layer, reversible 4 MiB
    for layers in (2, 4, 6):
        for role, per_layer in (("standard", 40), ("reversible", 4)):
            memory_case(
                store, run, f"reformer/cpu/c/{role}", (100 + per_layer * layers) * MIB,
                seq_len=512, model={"num_hidden_layers": layers},
            )  # fmt: skip
    # claim d: the published parameter counts
    for role in ("axial", "standard"):
        store.add_rows(
            run,
            None,
            {"kind": "parameters", "label": f"reformer/cpu/d/{role}-parameters"},
            [("parameters", PUBLISHED["d"][f"{role}_parameters"], "count")],
        )
    table = claims_table(store.to_dataframe())
    assert list(table.columns) == list(CLAIM_COLUMNS)
    rows = {(r["claim"][:40], r["setting"].split(":")[0]): r for _, r in table.iterrows()}
    a = table[table["claim"].str.startswith("a. local+LSH")].iloc[0]
    assert a["verdict"] == HOLDS and a["ours"].startswith("0.25 at L=8192 (measured")
    assert len(a["rows used"].split()) == 2
    sdpa = table[table["claim"].str.contains("SDPA")].iloc[0]
    assert sdpa["verdict"] == FAILS and sdpa["ours"].startswith("2.50 at L=8192 (predicted")
    c = table[table["claim"].str.startswith("c.")].iloc[0]
    assert c["verdict"] == HOLDS and c["ours"].startswith("0.10 (measured")
    d = table[table["claim"].str.contains("parameters")].iloc[0]
    assert d["verdict"] == HOLDS and d["ours"] == "2,584,064 vs 136,572,416 (x52.9)"
    # claims without rows say how to measure them
    for prefix in ("b.", "e.", "f."):
        missing = table[table["claim"].str.startswith(prefix)]
        assert list(missing["verdict"]) == [NOT_MEASURED], prefix
        assert "zoo reproduce reformer" in missing.iloc[0]["ours"]
    assert rows  # every row keyed


def test_no_rows_means_every_claim_not_measured(store) -> None:
    table = claims_table(store.to_dataframe())
    assert list(table["verdict"]) == [NOT_MEASURED] * len(CLAIM_TITLES)


def test_table2_rows_from_the_task_store(store) -> None:
    run = store.start_run(kind="task")
    accuracy = {  # train -> {metric name: accuracy}
        "shared-qk": {"accuracy": 1.0, "accuracy@full": 1.0, "accuracy@lsh-4": 0.9,
                      "accuracy@lsh-1": 0.5},
        "lsh-4": {"accuracy": 0.99, "accuracy@full": 0.2, "accuracy@lsh-4": 0.96,
                  "accuracy@lsh-1": 0.8},
    }  # fmt: skip
    for backend, metrics in accuracy.items():
        config = {"kind": "task", "task": "duplication", "preset": "cpu", "backend": backend}
        config |= {"length": 128, "seed": 0, "spec": {"scored_on": SCORED_ON}}
        store.add_rows(run, None, config, [(m, v, "fraction") for m, v in metrics.items()])
    table = claims_table(store.to_dataframe())
    f = table[table["claim"].str.startswith("f.")]
    assert list(f["verdict"]) == [HOLDS, HOLDS]  # rises with hashes; 0.99 / 1.0 on the diagonal
    assert f.iloc[1]["ours"] == "0.990"  # as trained (0.99), not the lsh-4 re-evaluation (0.96)


def test_table2_reads_no_run_of_an_earlier_duplication_preset(store) -> None:
    """Claim f reads duplication runs only as the preset they name is defined now."""
    run = store.start_run(kind="task")
    for backend in ("shared-qk", "lsh-4"):
        config = {"kind": "task", "task": "duplication", "preset": "cpu", "backend": backend}
        spec = {"train": {"max_steps": 1}, "scored_on": SCORED_ON}  # not cpu's
        config |= {"length": 128, "seed": 0, "spec": spec}
        store.add_rows(run, None, config, [("accuracy", 1.0, "fraction")])
    f = claims_table(store.to_dataframe())
    assert list(f[f["claim"].str.startswith("f.")]["verdict"]) == [NOT_MEASURED]


@pytest.mark.slow
@pytest.mark.long
def test_smoke_reproduction_end_to_end_resumes_after_an_interruption(
    tmp_path, monkeypatch, capsys
) -> None:
    from attention_zoo import sweep

    path = str(tmp_path / "zoo.sqlite")
    real_group, real_case, measured = sweep.measure_group, sweep.measure_case, []

    def interrupted(batch, settings, predicted=None):
        if len(measured) == 5:
            raise KeyboardInterrupt
        measured.extend(c.key() for c in batch)
        return real_group(batch, settings, predicted)

    # Cases are measured one by one (measure_case) or, when interleaved, as groups (measure_group).
    monkeypatch.setattr(sweep, "measure_group", interrupted)
    monkeypatch.setattr(
        sweep,
        "measure_case",
        lambda case, settings, predicted=None: interrupted([case], settings, predicted)[0],
    )
    assert (
        zoo(["reproduce", "reformer", "--preset", "smoke", "--store", path, "--no-progress"]) == 130
    )
    assert len(measured) == 5
    monkeypatch.setattr(sweep, "measure_group", real_group)
    monkeypatch.setattr(sweep, "measure_case", real_case)
    assert (
        zoo(["reproduce", "reformer", "--preset", "smoke", "--store", path, "--no-progress"]) == 0
    )
    out = capsys.readouterr().out
    assert "5 already stored" in out  # the interrupted run resumed: nothing measured twice
    with ResultStore(path, create=False) as store:
        cases = store.cases()
        df = store.to_dataframe()
    measured_runs = {
        c["run_id"]
        for c in cases
        if c["config"].get("label", "").startswith(("reformer/smoke/a/", "reformer/smoke/b/"))
    }
    assert len(measured_runs) == 1  # the interrupted run was continued, not started anew
    table = claims_table(df)
    measured_claims = table[table["verdict"] != NOT_MEASURED]["claim"].str[0]
    assert set(measured_claims) == set("abcdef")
    assert "The Reformer's claims, reproduced" in out and "rules:" in out


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES)
def test_every_case_of_every_size_builds(size: str) -> None:
    """Built on the meta device as CUDA would run it: a size measured only on a GPU (paper) fails
    here, not after a GPU has been found."""
    cases = [case for exp in experiments(size, device="cuda") for case in exp.cases]
    assert cases
    for case in cases:
        build_runnable(case, device="meta")
