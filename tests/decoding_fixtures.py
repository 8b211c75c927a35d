"""A synthetic store of decode cases with known answers: a KV cache's time per token linear in the
context, running sums and a window flat, recomputing the prefix quadratic; prefill cases beside."""

from __future__ import annotations

from pathlib import Path

from attention_zoo.measure.cases import BenchCase
from attention_zoo.store import ResultStore

LENGTHS = (1024, 4096, 16384)
NEW = 64
# (backend, decoder) -> (time per token [s] = a * L^p, state bytes at L)
LAWS = {
    ("sdpa", "own"): (1e-8, 1.0, lambda n: 2056 * (n + NEW)),
    ("sdpa", "recompute"): (1e-9, 2.0, lambda n: 3080 * (n + NEW)),
    ("linear", "own"): (2e-4, 0.0, lambda n: 66560),
    ("local", "own"): (3e-4, 0.0, lambda n: 261239),
}


def decode_case(backend: str, n: int, mode: str, decoder: str = "own") -> BenchCase:
    label = f"{backend} (recompute)" if decoder == "recompute" else ""
    return BenchCase(
        target="attention", backend=backend, seq_len=n, mode=mode, new_tokens=NEW,
        decoder=decoder, label=label,
    )  # fmt: skip


def make_decode_store(path: Path, *, busy: bool = False) -> Path:
    """The store at `path`: LAWS at LENGTHS, a refused nystrom case; one run, idle on 2 cores
    (busy: its load at start far above them, so every time is set aside)."""
    with ResultStore(path) as store:
        run = store.start_run(kind="bench", device="cpu")
        for (backend, decoder), (a, p, state) in LAWS.items():
            for n in LENGTHS:
                t = a * n**p
                rows = [("time_median", t, "s"), ("time_iqr", t / 50, "s"), ("time_min", t, "s")]
                rows += [("peak_bytes", 1000.0, "bytes"), ("state_bytes", state(n), "bytes")]
                store.add_rows(
                    run, None, decode_case(backend, n, "decode", decoder).to_dict(), rows
                )
                if decoder == "own":
                    prefill = [("time_median", 1e-6 * n, "s"), ("state_bytes", state(n), "bytes")]
                    case = decode_case(backend, n, "prefill")
                    store.add_rows(run, None, case.to_dict(), prefill)
        store.add_rows(
            run, None, decode_case("nystrom", 1024, "decode").to_dict(), [], status="skipped",
            error="backend 'nystrom' cannot decode token by token",
        )  # fmt: skip
        store.finish_run(run)
        load = 40.0 if busy else 0.0
        store._db.execute("UPDATE runs SET load_start = ?, load_end = 0.0, cpu_count = 2", (load,))
        store._db.commit()
    return path
