"""Our backends through SelfAttention vs Hugging Face's LSHSelfAttention and LocalSelfAttention.

The performance comparison: batch 1, 4 heads of 64 (hidden 256), float32, 2 threads, causal,
chunk 64 with one chunk before and none after; LSH with 4 hashes (--num-hashes) and
num_buckets = 2 * L / chunk, given explicitly to both sides. Every module has an input projection
and an output projection of the same sizes (HF's self-attention modules have no output projection,
so one Linear(256, 256) is added after them, as HF's ReformerAttention does), so the work compared
is the same. For each L: forward and forward+backward time (median of --repeats, all modules
timed round-robin so machine load hits them alike) and peak memory above resident
(torch.profiler memory events, the trusted CPU number; never RSS). Ratios are ours / HF's
(local -> HF local, lsh and everything else -> HF LSH).

    python benchmarks/scripts/compare_hf.py                       # L = 1024, 4096, 16384
    python benchmarks/scripts/compare_hf.py --lengths 1024 --repeats 3 --out results/hf
    python benchmarks/scripts/compare_hf.py --num-hashes 2 --backends lsh,local
    python benchmarks/scripts/compare_hf.py --semantics exact   # our exact patterns instead

Cases too big or too slow here are printed as "skipped: <reason>", never estimated. Timings are
only meaningful on an otherwise idle machine (a second busy process on 2 cores distorts ratios by
up to 7x); memory numbers are deterministic.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attention_zoo.attention.spec import list_backends
from attention_zoo.blocks.attention import SelfAttention
from attention_zoo.measure.cases import BenchCase
from attention_zoo.measure.memory import profiled_peak
from attention_zoo.measure.predict import predict_case
from attention_zoo.measure.runner import describe_error, is_oom
from attention_zoo.measure.table import format_table
from attention_zoo.measure.timing import time_interleaved
from attention_zoo.measure.units import format_bytes, format_seconds

HIDDEN, HEADS, HEAD_DIM, CHUNK = 256, 4, 64, 64


@dataclass
class Row:
    name: str
    seq_len: int
    status: str  # ok | skipped | error
    reason: str = ""
    fwd_s: float | None = None
    fwd_bwd_s: float | None = None
    fwd_peak_bytes: int | None = None
    fwd_bwd_peak_bytes: int | None = None
    reference: str | None = None  # the HF module the ratios divide by


def our_options(
    backend: str, seq_len: int, num_hashes: int, semantics: str = "hf"
) -> dict[str, Any]:
    defaults = next(s for s in list_backends() if s.name == backend).defaults()
    wanted = {
        "chunk_length": CHUNK,
        "num_chunks_before": 1,
        "num_chunks_after": 0,
        "num_hashes": num_hashes,
        "num_buckets": num_buckets(seq_len),
        "seed": 0,
        "semantics": semantics,  # hf: the same attention pattern as HF's modules
    }
    return {k: v for k, v in wanted.items() if k in defaults}


def num_buckets(seq_len: int) -> int:
    return max(2, 2 * seq_len // CHUNK)


class HFBlock(nn.Module):
    """HF self-attention (its own qk/v or q/k/v projections) + an output Linear, like
    ReformerAttention."""

    def __init__(self, kind: str, seq_len: int, num_hashes: int) -> None:
        super().__init__()
        from transformers import ReformerConfig
        from transformers.models.reformer.modeling_reformer import (
            LocalSelfAttention,
            LSHSelfAttention,
        )

        config = ReformerConfig(
            hidden_size=HIDDEN,
            num_attention_heads=HEADS,
            attention_head_size=HEAD_DIM,
            is_decoder=True,
            num_hashes=num_hashes,
            num_buckets=num_buckets(seq_len),
            hash_seed=0,
            lsh_attn_chunk_length=CHUNK,
            lsh_num_chunks_before=1,
            lsh_num_chunks_after=0,
            local_attn_chunk_length=CHUNK,
            local_num_chunks_before=1,
            local_num_chunks_after=0,
            lsh_attention_probs_dropout_prob=0.0,
            local_attention_probs_dropout_prob=0.0,
            hidden_dropout_prob=0.0,
            max_position_embeddings=max(seq_len, 4096),
            axial_pos_shape=[64, max(seq_len, 4096) // 64],
        )
        self.attention = (LSHSelfAttention if kind == "lsh" else LocalSelfAttention)(config)
        self.out = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.attention(x).hidden_states)


def build_modules(
    backends: list[str], seq_len: int, num_hashes: int, semantics: str = "hf"
) -> tuple[dict[str, nn.Module], list[Row]]:
    modules: dict[str, nn.Module] = {}
    skipped: list[Row] = []
    for name in backends:
        if reason := next(s for s in list_backends() if s.name == name).unavailable_reason("cpu"):
            skipped.append(Row(name, seq_len, "skipped", reason))
            continue
        modules[name] = SelfAttention(
            HIDDEN,
            HEADS,
            name,
            head_size=HEAD_DIM,
            causal=True,
            device="cpu",
            **our_options(name, seq_len, num_hashes, semantics),
        )
    try:
        modules["HF lsh"] = HFBlock("lsh", seq_len, num_hashes)
        modules["HF local"] = HFBlock("local", seq_len, num_hashes)
    except ImportError as exc:
        skipped += [
            Row(n, seq_len, "skipped", f"transformers not importable: {exc}")
            for n in ("HF lsh", "HF local")
        ]
    return modules, skipped


def too_big(
    name: str, seq_len: int, num_hashes: int, limit_bytes: int, max_quadratic: int
) -> str | None:
    """Why to skip, from the prediction (nothing allocated) and the length cap on O(n^2) work."""
    if name.startswith("HF"):
        return None
    spec = next(s for s in list_backends() if s.name == name)
    if max_quadratic and spec.caps.exact and seq_len > max_quadratic:
        return (
            f"exact attention does O(L^2) work; at L={seq_len} one fwd+bwd takes minutes "
            f"on 2 CPU threads (raise --max-quadratic to run it)"
        )
    case = BenchCase(
        target="block",
        backend=name,
        seq_len=seq_len,
        num_heads=HEADS,
        head_dim=HEAD_DIM,
        hidden=HIDDEN,
        mode="forward+backward",
        options=our_options(name, seq_len, num_hashes),
    )
    predicted = predict_case(case).total_bytes
    if predicted > limit_bytes:
        return (
            f"predicted {format_bytes(predicted)} for fwd+bwd > limit {format_bytes(limit_bytes)}"
        )
    return None


def measure_length(seq_len: int, args: argparse.Namespace) -> list[Row]:
    torch.manual_seed(0)
    modules, rows = build_modules(args.backends, seq_len, args.num_hashes, args.semantics)
    for name in list(modules):
        if reason := too_big(name, seq_len, args.num_hashes, args.memory_limit, args.max_quadratic):
            rows.append(Row(name, seq_len, "skipped", reason))
            del modules[name]
    x = torch.randn(1, seq_len, HIDDEN)

    def forward(m: nn.Module):
        def run() -> None:
            with torch.no_grad():
                m(x)

        return run

    def forward_backward(m: nn.Module):
        def run() -> None:
            m(x).sum().backward()
            for p in m.parameters():
                p.grad = None

        return run

    results: dict[str, Row] = {name: Row(name, seq_len, "ok") for name in modules}
    for name, m in list(modules.items()):  # memory first (deterministic), one module at a time
        try:
            forward_backward(m)()  # warm-up
            results[name].fwd_peak_bytes = profiled_peak(forward(m))[1].peak_bytes
            results[name].fwd_bwd_peak_bytes = profiled_peak(forward_backward(m))[1].peak_bytes
        except Exception as exc:
            results[name] = Row(
                name, seq_len, "skipped" if is_oom(exc) else "error", describe_error(exc)
            )
            del modules[name]
    for label, make in (("fwd_s", forward), ("fwd_bwd_s", forward_backward)):
        stats = time_interleaved(
            {n: make(m) for n, m in modules.items()}, warmup=1, repeats=args.repeats
        )
        for name, s in stats.items():
            setattr(results[name], label, s.median)
    for row in results.values():
        if not row.name.startswith("HF"):
            row.reference = "HF local" if row.name == "local" else "HF lsh"
    return rows + list(results.values())


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


def render(rows: list[Row]) -> str:
    by_key = {(r.name, r.seq_len): r for r in rows}
    headers = [
        "L",
        "module",
        "fwd time",
        "fwd+bwd time",
        "fwd peak",
        "fwd+bwd peak",
        "vs",
        "fwd time x",
        "fwd+bwd time x",
        "fwd+bwd mem x",
    ]
    table = []
    for r in rows:
        if r.status != "ok":
            table.append([r.seq_len, r.name, f"{r.status}: {r.reason}", "", "", "", "", "", "", ""])
            continue
        ref = by_key.get((r.reference, r.seq_len)) if r.reference else None
        ok_ref = ref if ref is not None and ref.status == "ok" else None
        table.append(
            [
                r.seq_len,
                r.name,
                format_seconds(r.fwd_s),
                format_seconds(r.fwd_bwd_s),
                format_bytes(r.fwd_peak_bytes),
                format_bytes(r.fwd_bwd_peak_bytes),
                r.reference or "",
                ratio(r.fwd_s, ok_ref and ok_ref.fwd_s),
                ratio(r.fwd_bwd_s, ok_ref and ok_ref.fwd_bwd_s),
                ratio(r.fwd_bwd_peak_bytes, ok_ref and ok_ref.fwd_bwd_peak_bytes),
            ]
        )
    return format_table(headers, table)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--lengths", default="1024,4096,16384", help="comma list of L (default: %(default)s)"
    )
    p.add_argument(
        "--backends",
        default=None,
        help="comma list of our backends (default: every registered one)",
    )
    p.add_argument(
        "--num-hashes",
        type=int,
        default=4,
        help="LSH hash rounds, both sides (default: %(default)s)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="timed repeats per module, interleaved (default: %(default)s)",
    )
    p.add_argument("--threads", type=int, default=2, help="torch threads (default: %(default)s)")
    p.add_argument(
        "--semantics",
        choices=("hf", "exact"),
        default="hf",
        help="semantics of our local and lsh: hf computes HF's attention pattern (like with "
        "like), exact our exactly causal one (default: %(default)s)",
    )
    p.add_argument(
        "--max-quadratic",
        type=int,
        default=0,
        help="longest L at which exact O(L^2) backends run "
        "(default: no cap; the memory limit decides)",
    )
    p.add_argument(
        "--memory-limit",
        type=float,
        default=8.0,
        help="GiB; predicted-larger cases are skipped (default: 8)",
    )
    p.add_argument(
        "--out",
        default="results/compare_hf",
        help="writes OUT.csv and OUT.json (default: %(default)s)",
    )
    args = p.parse_args(argv)
    args.lengths = [int(x) for x in args.lengths.split(",")]
    args.backends = args.backends.split(",") if args.backends else [s.name for s in list_backends()]
    args.memory_limit = int(args.memory_limit * 2**30)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    rows: list[Row] = []
    for n in args.lengths:
        print(f"L={n} ...", file=sys.stderr, flush=True)
        rows += measure_length(n, args)
    print(
        f"batch 1, {HEADS} heads x {HEAD_DIM}, hidden {HIDDEN}, float32, causal, "
        f"chunk {CHUNK} (1 before, 0 after), "
        f"lsh {args.num_hashes} hashes, buckets 2L/{CHUNK}, our semantics {args.semantics}, "
        f"{torch.get_num_threads()} threads, "
        f"median of {args.repeats} interleaved repeats; memory = profiler peak above resident"
    )
    print(render(rows))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    records = [asdict(r) for r in rows]
    meta = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "num_hashes": args.num_hashes,
        "semantics": args.semantics,
        "repeats": args.repeats,
        "hidden": HIDDEN,
        "heads": HEADS,
        "head_dim": HEAD_DIM,
        "chunk": CHUNK,
    }
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": records}, indent=2))
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)
    print(f"wrote {out.with_suffix('.csv')} and {out.with_suffix('.json')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
