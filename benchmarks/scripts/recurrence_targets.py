"""The recurrences' CPU targets against fla's plain PyTorch references, on an idle machine: at
`--length` tokens (16k), forward+backward, our chunked kernels take at most 0.5x the time of fla's
naive chunked reference where fla has one (the delta rule, the gated delta rule, simple GLA), and a
forward at `--long` tokens (64k) peaks within 2 GiB (profiler memory events).

    python benchmarks/scripts/recurrence_targets.py             # both targets, 16k and 64k
    python benchmarks/scripts/recurrence_targets.py --length 4096 --repeats 3

Timed interleaved, the best of `--repeats` calls each, at (1, 4, n, 64) in float32, chunks of 64,
torch threads as set (`--threads`). Exit 0 when every target passes, 1 when one fails, 2 when
fla-core is not installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor
from torch.nn import functional as F

from attention_zoo.attention.kernels.recurrences.decay import chunk_decay
from attention_zoo.attention.kernels.recurrences.delta import chunk_delta
from attention_zoo.measure.memory import profiled_peak

B, H, D, CHUNK = 1, 4, 64, 64
TIME_TARGET = 0.5  # ours / fla's naive chunked reference, forward+backward
MEMORY_TARGET = 2 * 2**30  # bytes: a forward's peak at the long length


@dataclass(frozen=True)
class Mechanism:
    """One recurrence: our kernel and fla's naive chunked reference, each on (b, h, n, d) inputs."""

    name: str
    family: str  # fla.ops.<family>.naive
    ours: Callable[[dict[str, Tensor]], Tensor]
    theirs: Callable[[ModuleType, dict[str, Tensor]], Tensor]


def _fla_layout(*tensors: Tensor) -> list[Tensor]:
    """(b, h, n, ...) -> fla's (b, n, h, ...)."""
    return [t.transpose(1, 2) for t in tensors]


MECHANISMS = (
    Mechanism(
        "delta rule",
        "delta_rule",
        lambda x: chunk_delta(x["q"], x["k"], x["v"], x["beta"], scale=D**-0.5)[0],
        lambda fla, x: fla.delta_rule_chunkwise(
            x["q"], x["k"], x["v"], x["beta"], chunk_size=CHUNK
        )[0],  # (b, h, n, d), scaled by d**-0.5 inside
    ),
    Mechanism(
        "gated delta rule",
        "gated_delta_rule",
        lambda x: chunk_delta(x["q"], x["k"], x["v"], x["beta"], x["g"], scale=D**-0.5)[0],
        lambda fla, x: fla.naive_chunk_gated_delta_rule(
            *_fla_layout(x["q"], x["k"], x["v"], x["g"], x["beta"]),
            chunk_size=CHUNK,
            scale=D**-0.5,
        )[0],
    ),
    Mechanism(
        "simple GLA",
        "simple_gla",
        lambda x: chunk_decay(x["q"], x["k"], x["v"], x["g"], scale=D**-0.5)[0],
        lambda fla, x: fla.naive_chunk_simple_gla(
            *_fla_layout(x["q"], x["k"], x["v"], x["g"]),
            None,
            False,
            chunk_size=CHUNK,
            scale=D**-0.5,
        )[0],
    ),
)


def fla_naive(family: str) -> ModuleType | None:
    """fla.ops.<family>.naive loaded alone (plain PyTorch: importing fla itself imports Triton);
    None where fla-core is not installed."""
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0], "ops", family, "naive.py")
    module_spec = importlib.util.spec_from_file_location(f"_fla_naive_{family}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def inputs(n: int, *, grad: bool, seed: int = 0) -> dict[str, Tensor]:
    """L2-normalised keys, beta in (0, 1), log decays <= 0: the delta rule's stable regime."""
    gen = torch.Generator().manual_seed(seed)
    x = {
        "q": torch.randn(B, H, n, D, generator=gen),
        "k": F.normalize(torch.randn(B, H, n, D, generator=gen), dim=-1),
        "v": torch.randn(B, H, n, D, generator=gen),
        "beta": torch.randn(B, H, n, generator=gen).sigmoid(),
        "g": F.logsigmoid(torch.randn(B, H, n, generator=gen) + 2),
    }
    return {name: t.requires_grad_(grad) for name, t in x.items()}


def step(run: Callable[[dict[str, Tensor]], Tensor], x: dict[str, Tensor]) -> float:
    """Seconds of one forward+backward."""
    for t in x.values():
        t.grad = None
    start = time.perf_counter()
    run(x).sum().backward()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--length", type=int, default=16384, help="the timed length (16384)")
    parser.add_argument("--long", type=int, default=65536, help="the forward's length (65536)")
    parser.add_argument("--repeats", type=int, default=2, help="calls each, the best kept (2)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (as set)")
    args = parser.parse_args(argv)
    for name in ("length", "long", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    modules = {m.family: fla_naive(m.family) for m in MECHANISMS}
    if any(module is None for module in modules.values()):
        print("recurrence_targets.py: needs fla-core (pip install fla-core)", file=sys.stderr)
        return 2
    failed = False
    small = inputs(4 * CHUNK, grad=False)
    for m in MECHANISMS:  # the two compute the same, or the times compare nothing
        ours, theirs = m.ours(small), m.theirs(modules[m.family], small)
        theirs = theirs if theirs.shape == ours.shape else theirs.transpose(1, 2)
        torch.testing.assert_close(ours, theirs, rtol=1e-3, atol=1e-3, msg=m.name)
    x = inputs(args.length, grad=True)
    print(f"forward+backward at {args.length} tokens, (1, {H}, n, {D}) float32, chunks of "
          f"{CHUNK}, {torch.get_num_threads()} threads, best of {args.repeats}")  # fmt: skip
    print(f"{'mechanism':<18} {'ours':>9} {'fla naive':>10} {'ratio':>7}  target <= {TIME_TARGET}x")
    for m in MECHANISMS:
        theirs = lambda x, m=m: m.theirs(modules[m.family], x)  # noqa: E731
        best = {"ours": float("inf"), "theirs": float("inf")}
        for _ in range(args.repeats):  # interleaved: a slow moment costs both sides alike
            best["ours"] = min(best["ours"], step(m.ours, x))
            best["theirs"] = min(best["theirs"], step(theirs, x))
        ratio = best["ours"] / best["theirs"]
        failed |= ratio > TIME_TARGET
        verdict = "PASS" if ratio <= TIME_TARGET else "FAIL"
        print(f"{m.name:<18} {best['ours']:8.3f}s {best['theirs']:9.3f}s {ratio:6.3f}x  {verdict}")
    print(f"\nforward at {args.long} tokens, peak (profiler memory events), target <= 2 GiB")
    long = inputs(args.long, grad=False)
    for m in MECHANISMS:
        with torch.no_grad():
            _, peak = profiled_peak(lambda m=m: m.ours(long))
        failed |= peak.peak_bytes > MEMORY_TARGET
        verdict = "PASS" if peak.peak_bytes <= MEMORY_TARGET else "FAIL"
        print(f"{m.name:<18} {peak.peak_bytes / 2**20:8.1f} MiB  {verdict}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
