"""Peak memory of one training step (forward + backward) per residual variant, as layers are added.

Reversible layers keep no per-layer activations, so their peak should grow per added layer by about
the parameter gradients only; standard residuals grow by every layer's activations. The check: the
reversible per-layer growth is at most a quarter of the standard one.

Memory is the profiler's peak of live CPU tensor bytes during the step (deterministic, see
attention_zoo.measure.memory), with parameters allocated before and gradients set to None, so the
gradients count. Times are medians of wall-clock steps: only meaningful on an idle machine.

    python benchmarks/scripts/residual_memory.py         # L=4096, local+lsh, 2/4/8 layers
    python benchmarks/scripts/residual_memory.py --hf                 # also HF's ReformerModel
    python benchmarks/scripts/residual_memory.py --length 1024 --attn-layers full,shared-qk
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from attention_zoo import ReformerConfig, ReformerModel, ZooError
from attention_zoo.attention.spec import BACKENDS
from attention_zoo.measure import profiled_peak

MIB = 2**20


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--layers", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=1024)
    p.add_argument(
        "--attn-layers", default="local,lsh", help="comma-separated registry names, cycled"
    )
    p.add_argument("--residuals", default="standard,checkpoint,reversible")
    p.add_argument("--repeats", type=int, default=3, help="timed steps per case (median)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--hf", action="store_true", help="also measure transformers' ReformerModel")
    p.add_argument("--json", default=None, help="write the rows to this JSON file")
    return p.parse_args(argv)


def axial_for(length: int, hidden: int) -> dict[str, Any]:
    """Axial shape with product `length` (n1: a power of two <= sqrt), dims hidden/4 + 3/4."""
    n1 = 1
    while (n1 * 2) ** 2 <= length and length % (n1 * 2) == 0:
        n1 *= 2
    return {
        "axial_pos_shape": (n1, length // n1),
        "axial_pos_embds_dim": (hidden // 4, hidden - hidden // 4),
        "max_position_embeddings": length,
    }


def our_config(args: argparse.Namespace, residual: str, layers: int) -> ReformerConfig:
    return ReformerConfig(
        vocab_size=320,
        hidden_size=args.hidden,
        num_attention_heads=args.heads,
        num_hidden_layers=layers,
        attn_layers=tuple(args.attn_layers.split(",")),
        feed_forward_size=args.ffn,
        is_decoder=True,
        residual=residual,
        **axial_for(args.length, args.hidden),
    )


def hf_model(args: argparse.Namespace, layers: int) -> torch.nn.Module:
    from transformers import ReformerConfig as HFConfig
    from transformers import ReformerModel as HFModel

    names = args.attn_layers.split(",")
    axial = axial_for(args.length, args.hidden)
    cfg = HFConfig(
        vocab_size=320,
        hidden_size=args.hidden,
        num_attention_heads=args.heads,
        attention_head_size=args.hidden // args.heads,
        num_hidden_layers=layers,
        attn_layers=[names[i % len(names)] for i in range(layers)],
        feed_forward_size=args.ffn,
        is_decoder=True,
        axial_pos_shape=axial["axial_pos_shape"],
        axial_pos_embds_dim=axial["axial_pos_embds_dim"],
        max_position_embeddings=args.length,
    )
    return HFModel(cfg).train()


def measure(model: torch.nn.Module, ids: torch.Tensor, repeats: int) -> dict[str, float]:
    """Peak bytes of one step (after a warm-up step) and the median step time."""

    def step() -> None:
        out = model(ids)
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        hidden.float().pow(2).mean().backward()

    def fresh() -> None:
        model.zero_grad(set_to_none=True)

    fresh()
    step()  # warm-up: lazy initialisation, allocator caches
    fresh()
    _, mem = profiled_peak(step)
    times = []
    for _ in range(repeats):
        fresh()
        began = time.perf_counter()
        step()
        times.append(time.perf_counter() - began)
    return {
        "peak_mib": mem.peak_bytes / MIB,
        "step_s": statistics.median(times) if times else float("nan"),
    }


def slope(xs: list[int], ys: list[float]) -> float:
    """Least-squares growth of y per unit of x."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def run_variant(
    name: str, build: Callable[[int], torch.nn.Module], args: argparse.Namespace
) -> list[dict]:
    rows = []
    ids = torch.randint(0, 320, (args.batch, args.length))
    for layers in args.layers:
        torch.manual_seed(0)
        try:
            model = build(layers)
            row = {"variant": name, "layers": layers, **measure(model, ids, args.repeats)}
        except (ZooError, ImportError, RuntimeError, ValueError) as err:
            row = {"variant": name, "layers": layers, "skipped": f"{type(err).__name__}: {err}"}
        rows.append(row)
        print(
            f"  {name:>11} layers={layers}: "
            + (
                f"peak {row['peak_mib']:.1f} MiB, {row['step_s']:.3f} s/step"
                if "skipped" not in row
                else f"skipped: {row['skipped']}"
            ),
            file=sys.stderr,
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    missing = [b for b in args.attn_layers.split(",") if b not in BACKENDS]
    rows: list[dict] = []
    for residual in args.residuals.split(","):
        if missing:
            rows += [
                {
                    "variant": residual,
                    "layers": n,
                    "skipped": f"backend(s) {missing} not registered",
                }
                for n in args.layers
            ]
            continue
        rows += run_variant(
            residual,
            lambda n, r=residual: ReformerModel(our_config(args, r, n), device="cpu"),
            args,
        )
    if args.hf:
        rows += run_variant("hf", lambda n: hf_model(args, n), args)
    print_table(rows, args)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {"args": vars(args), "threads": torch.get_num_threads(), "rows": rows}, fh, indent=2
            )
    return 0


def print_table(rows: list[dict], args: argparse.Namespace) -> None:
    print(
        f"one training step, batch {args.batch}, L={args.length}, hidden {args.hidden}, "
        f"{args.heads} heads, "
        f"FFN {args.ffn}, attn_layers {args.attn_layers}, torch threads {torch.get_num_threads()}"
    )
    print(
        f"{'variant':>11} | "
        + " | ".join(f"{n} layers: MiB, s" for n in args.layers)
        + " | MiB/layer | s/step vs standard"
    )
    growth, times = {}, {}
    for variant in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == variant]
        ok = [r for r in mine if "skipped" not in r]
        cells = [
            f"{r['peak_mib']:.1f}, {r['step_s']:.2f}" if "skipped" not in r else "skipped"
            for r in mine
        ]
        if len(ok) >= 2:
            growth[variant] = slope([r["layers"] for r in ok], [r["peak_mib"] for r in ok])
            times[variant] = statistics.fmean(r["step_s"] for r in ok)
        ratio = (
            f"{times[variant] / times['standard']:.2f}x"
            if variant in times and "standard" in times
            else "-"
        )
        per_layer = f"{growth[variant]:.2f}" if variant in growth else "-"
        print(
            f"{variant:>11} | "
            + " | ".join(f"{c:>17}" for c in cells)
            + f" | {per_layer:>9} | {ratio}"
        )
    for r in rows:
        if "skipped" in r:
            print(f"skipped: {r['variant']} with {r['layers']} layers: {r['skipped']}")
    if "reversible" in growth and "standard" in growth:
        ratio = growth["reversible"] / growth["standard"]
        verdict = "PASS" if ratio <= 0.25 else "FAIL"
        print(
            f"reversible grows {ratio:.3f}x as much per layer as standard "
            f"(must be <= 0.25): {verdict}"
        )


if __name__ == "__main__":
    sys.exit(main())
