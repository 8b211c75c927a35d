"""A synthetic results store with known answers for the report tests: exact power laws, a crossover
at a known length, an OOM case, times set aside (a busy run's without a reading of its own, an
unstable one) beside a time of the busy run whose own reading was idle (kept), task runs with cost
rows of the same model, and residual / feed-forward variants."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attention_zoo.measure.cases import BenchCase
from attention_zoo.reproduce import get_reproduction
from attention_zoo.store import ResultStore
from attention_zoo.tasks.results import case_config, encode_metric

LENGTHS = (256, 1024, 4096)
# backend -> (options, time prefactor [s], exponent, memory prefactor [bytes])
LAWS = {
    "full": ({}, 1e-9, 2.0, 100.0),
    "sdpa": ({}, 2e-9, 1.8, 50.0),
    "lsh": ({"num_hashes": 1}, 1e-6, 1.0, 400.0),  # 1 is lsh's default: labelled plain `lsh`
}
# lsh's approx_error per input family (against full; the others are exact)
LSH_ERRORS = {"approx_error_random": 2.5, "approx_error_peaked": 0.25}
# the crossover of lsh below sdpa in time: 1e-6 L = 2e-9 L^1.8  ->  L = 500 ** 1.25
LSH_BEATS_SDPA_FROM = 500**1.25
TASK_MODEL = {
    "hidden_size": 64,
    "num_attention_heads": 2,
    "num_hidden_layers": 1,
    "feed_forward_size": 128,
    "vocab_size": 16,
    "max_position_embeddings": 64,
    "is_decoder": True,
    "axial_pos_embds": False,
}
TASK_LENGTH, TASK_BATCH = 64, 8


def block_case(backend: str, n: int, mode: str = "forward", **changes) -> BenchCase:
    return BenchCase(target="block", backend=backend, seq_len=n, mode=mode, **changes)


def _bench_run(store: ResultStore) -> str:
    run = store.start_run(kind="bench", device="cpu")
    for backend, (options, a, p, m) in LAWS.items():
        for n in LENGTHS:
            case = block_case(backend, n, options=options)
            if backend == "full" and n == LENGTHS[-1]:
                store.add_rows(
                    run, None, case.to_dict(), [], status="oom", error="predicted 30 GiB > 20 GiB"
                )
                continue
            t = a * n**p
            rows = [
                ("time_median", t, "s"),
                ("time_iqr", t / 20, "s"),
                ("peak_bytes", m * n, "bytes"),
            ]
            if backend == "lsh":
                rows += [(name, e * n / 1024, "ratio") for name, e in LSH_ERRORS.items()]
            store.add_rows(run, None, case.to_dict(), rows)
    store.finish_run(run)
    return run


def _model_case(model: dict, **changes) -> BenchCase:
    fields = {
        "target": "model",
        "backend": "+".join(model.get("attn_layers", ["shared-qk"])),
        "seq_len": TASK_LENGTH,
        "batch": TASK_BATCH,
        "num_heads": model["num_attention_heads"],
        "head_dim": model["hidden_size"] // model["num_attention_heads"],
        "hidden": model["hidden_size"],
        "mode": "train-step",
        "model": model,
        **changes,
    }
    return BenchCase(**fields)


def _task_runs(store: ResultStore) -> None:
    """Two trained variants x two seeds with Table 2 overrides, and the cost of each model."""
    run = store.start_run(kind="task", device="cpu")
    cost_run = store.start_run(kind="bench", device="cpu")
    accuracy = {"shared-qk": (0.9, 1.0), "lsh-2": (0.5, 0.7)}
    for label, layers, hashes, step_time in (
        ("shared-qk", ["shared-qk"], None, 0.02),
        ("lsh-2", ["lsh"], 2, 0.01),
    ):
        model = {**TASK_MODEL, "attn_layers": layers}
        if hashes:
            model["num_hashes"] = hashes
        spec = {
            "preset": "tiny",
            "task": {"name": "duplication", "seq_len": TASK_LENGTH},
            "model": model,
            "train": {"batch_size": TASK_BATCH},
            "variant": label,
        }
        for seed, acc in zip((0, 1), accuracy[label]):
            ident = {"task": "duplication", "preset": "tiny", "backend": label,
                     "length": TASK_LENGTH, "seed": seed}  # fmt: skip
            config = case_config(ident, {**spec, "seed": seed})
            rows = [
                (encode_metric("accuracy", "trained"), acc, "fraction"),
                (encode_metric("accuracy", "lsh-8"), acc / 2, "fraction"),
                ("steps_to_95", 100.0 * (seed + 1), "steps"),
            ]
            store.add_rows(run, None, config, rows)
        case = _model_case(model, label=label)
        store.add_rows(
            cost_run,
            None,
            case.to_dict(),
            [
                ("time_median", step_time, "s"),
                ("time_iqr", step_time / 10, "s"),
                ("peak_bytes", 2**20 * (1 + (hashes or 3)), "bytes"),
            ],
        )
    store.finish_run(run)
    store.finish_run(cost_run)


def _variant_runs(store: ResultStore) -> None:
    """standard: 4 MiB per layer, reversible: 1 MiB per layer (exact); chunked FFN at 0.5x."""
    run = store.start_run(kind="bench", device="cpu")
    base = {**TASK_MODEL, "attn_layers": ["local"]}
    for residual, per_layer, time_s in (("standard", 4, 0.1), ("reversible", 1, 0.15)):
        for layers in (2, 4):
            model = {**base, "residual": residual, "num_hidden_layers": layers}
            rows = [
                ("time_median", time_s * layers, "s"),
                ("peak_bytes", 2**20 * (10 + per_layer * layers), "bytes"),
            ]
            store.add_rows(run, None, _model_case(model).to_dict(), rows)
    for chunk, peak in ((0, 8), (16, 4)):
        model = {
            **base,
            "chunk_size_feed_forward": chunk,
            "residual": "reversible",
            "num_hidden_layers": 1,
        }
        rows = [("time_median", 0.2, "s"), ("peak_bytes", 2**20 * peak, "bytes")]
        store.add_rows(run, None, _model_case(model, mode="forward+backward").to_dict(), rows)
    store.finish_run(run)


SET_ASIDE_LENGTH = 512  # times off every law: a report that ranked or fitted them would show it


def _set_aside_runs(store: ResultStore) -> str:
    """At SET_ASIDE_LENGTH: `full` in a run to be marked busy at its start (its id is returned),
    with no reading of its own, so the run's load marks it; `lsh` in the same run, its own reading
    idle (every core free while it was timed), so it keeps its ranking, on its law; and `sdpa`
    with repeats that disagreed (IQR as large as the median) in an idle run."""
    runs = {}
    lsh_options, lsh_a, _, lsh_m = LAWS["lsh"]
    lsh = [
        ("time_median", lsh_a * SET_ASIDE_LENGTH, "s"),
        ("time_iqr", lsh_a * SET_ASIDE_LENGTH / 20, "s"),
        ("peak_bytes", lsh_m * SET_ASIDE_LENGTH, "bytes"),
        ("free_cores", 2.0, "cores"),
    ]
    for backend, iqr_share in (("full", 0.05), ("sdpa", 1.0)):
        run = runs[backend] = store.start_run(kind="bench", device="cpu")
        t = 1.0  # seconds: far off every law at this length
        rows = [("time_median", t, "s"), ("time_iqr", t * iqr_share, "s"), ("time_min", t, "s")]
        rows.append(("peak_bytes", 10.0, "bytes"))  # the leanest there: memory is never set aside
        case = block_case(backend, SET_ASIDE_LENGTH, options=LAWS[backend][0])
        store.add_rows(run, None, case.to_dict(), rows)
        if backend == "full":
            case = block_case("lsh", SET_ASIDE_LENGTH, options=lsh_options)
            store.add_rows(run, None, case.to_dict(), lsh)
        store.finish_run(run)
    return runs["full"]


COUNTED_BATCH = 2  # the setting of _counted_run's cases


def _counted_run(store: ResultStore) -> None:
    """`sdpa` and `lsh` on LAWS at batch COUNTED_BATCH, with every other metric the report
    tabulates: FLOPs (so a FLOP rate), the predicted peak, a decoding state, the fair-comparison
    numbers and lsh's approx_error."""
    run = store.start_run(kind="bench", device="cpu")
    for backend in ("sdpa", "lsh"):
        options, a, p, m = LAWS[backend]
        for n in LENGTHS:
            t = a * n**p
            rows = [("time_median", t, "s"), ("time_iqr", t / 20, "s"),
                    ("peak_bytes", m * n, "bytes"), ("predicted_peak_bytes", m * n, "bytes"),
                    ("state_bytes", 64.0 * n, "bytes"), ("flops", 4e3 * n * n, "flop"),
                    ("block_parameters", 65536.0, "count"),
                    ("state_bytes_per_sequence", 64.0 * n, "bytes"),
                    ("flops_per_token", 4e3 * n, "flop")]  # fmt: skip
            if backend == "lsh":
                rows += [(name, e, "ratio") for name, e in LSH_ERRORS.items()]
            case = block_case(backend, n, options=options, batch=COUNTED_BATCH)
            store.add_rows(run, None, case.to_dict(), rows)
    store.finish_run(run)


def make_store(path: Path, *, busy: bool = False, counted: bool = False) -> Path:
    """The synthetic store at `path`, every run idle on 2 cores whatever this machine's load is
    (module-scoped fixtures build it before the tests' idle CPU counters are patched in); busy:
    with times set aside (_set_aside_runs), one run's load at start far above its cores;
    counted: with a setting of every reported metric (_counted_run)."""
    with ResultStore(path) as store:
        _bench_run(store)
        busy_run = _set_aside_runs(store) if busy else None
        if counted:
            _counted_run(store)
        _task_runs(store)
        _variant_runs(store)
        store._db.execute("UPDATE runs SET load_start = 0.0, load_end = 0.0, cpu_count = 2")
        store._db.execute("UPDATE runs SET load_start = 40.0 WHERE run_id = ?", (busy_run,))
        store._db.commit()
    return path


def build_busy_report(folder: Path, **options: Any) -> tuple[Path, Any]:
    """(store, ReportFiles): make_store(busy=True) in `folder` and its report in folder/rep, by
    default with the Reformer's claims (built only where pandas is, as the report tests skip)."""
    from attention_zoo.report import build_report

    options.setdefault("reproductions", [get_reproduction("reformer")])
    path = make_store(folder / "s.sqlite", busy=True)
    with ResultStore(path) as store:
        files = build_report(store.to_dataframe(), folder / "rep", runs=store.runs(), **options)
    return path, files
