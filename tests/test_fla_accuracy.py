"""fla's kernels against our references by RMS ratio (rms(out - ref) / rms(ref), as fla's tests
compare), outputs and every gradient, at the lengths we benchmark. On the CPU fla's plain PyTorch
references stand in for its Triton kernels, which tests the metric and the adapters; on CUDA (the
gpu marker, run by the GPU check) fla's kernels run, and every case's numbers are written to
$ZOO_ACCURACY_OUT/fla-accuracy.jsonl where that is set, passed or not."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from torch import Tensor
from torch.nn import functional as F

from attention_zoo import build_attention, get_backend
from attention_zoo.attention.dispatch import Call
from attention_zoo.attention.kernels.recurrences.decay import chunk_decay
from attention_zoo.attention.kernels.recurrences.delta import chunk_delta
from attention_zoo.attention.kernels.sums.fla import fla_sums
from attention_zoo.measure.accuracy import compare, outputs_and_grads, rms_ratio

from .test_recurrence_delta import _fla_naive

LENGTHS = (4096, 16384)  # the lengths the GPU check's targets are set at
CUDA_LENGTHS = (*LENGTHS, 65536)  # and the longest its quick grid benchmarks
B, H, D = 1, 4, 64  # the targets' (1, 4, n, 64)
# RMS ratio fla's kernels (bfloat16, the dtype they run in here) may reach against the float64
# reference on the same rounded inputs: fla's own chunk tests allow 0.008 for outputs and q, k
# gradients and 0.02 for the gates' and betas' in float16 at a few hundred tokens; bfloat16 keeps
# three bits fewer
TOLERANCE = {"out": 2e-2, "dq": 2e-2, "dk": 2e-2, "dv": 2e-2}
EXTRA_TOLERANCE = 5e-2  # the gradients of the extra inputs (decays, betas)
CPU_TOLERANCE = 1e-5  # float32 against float32: the same sums in another order


def _draw(*shape: int, seed: int) -> Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


# ---- the metric -------------------------------------------------------------------------------


def test_the_ratio_is_the_relative_rms_of_the_difference():
    ref = _draw(3, 1000, seed=0)
    r = rms_ratio(ref * 1.01, ref)
    assert r.denominator == pytest.approx(float(ref.square().mean().sqrt()), rel=1e-6)
    assert r.numerator == pytest.approx(0.01 * r.denominator, rel=1e-4)
    assert r.ratio == pytest.approx(0.01, rel=1e-4)
    assert r.row() == {"numerator": r.numerator, "denominator": r.denominator, "ratio": r.ratio}


def test_the_rms_of_16_bit_tensors_is_summed_in_float32():
    """300 squared overflows float16: summed in the tensors' own dtype the RMS would be inf."""
    ref = torch.full((64,), 300.0, dtype=torch.float16)
    out = ref + torch.ones(64, dtype=torch.float16)
    r = rms_ratio(out, ref)
    assert (r.numerator, r.denominator) == (1.0, 300.0)


def test_a_zero_reference_gives_zero_or_infinity_not_an_error():
    zero = torch.zeros(4)
    assert rms_ratio(zero, zero).ratio == 0.0
    assert rms_ratio(torch.ones(4), zero).ratio == float("inf")


def test_compare_pairs_each_result_with_its_reference():
    a, b = _draw(8, seed=1), _draw(8, seed=2)
    got = compare([a, b], [a, a], ["out", "dq"])
    assert got["out"].numerator == 0 and got["dq"].numerator > 0
    with pytest.raises(ValueError, match="2 results, 1 references"):
        compare([a, b], [a], ["out", "dq"])


# ---- on the CPU: fla's plain references against our chunked kernels, float32 -------------------


def _report(case: str, ratios: dict) -> str:
    return "; ".join(
        f"{case} {name}: {r.numerator:.3g} / {r.denominator:.3g} = {r.ratio:.3g}"
        for name, r in ratios.items()
    )


def _assert_within(case: str, ratios: dict, tolerance: float | dict[str, float]) -> None:
    """Every ratio within its tolerance (one for all, or one per tensor name)."""
    print(_report(case, ratios))  # the numbers, in -s or -rA output
    limit = tolerance if isinstance(tolerance, dict) else dict.fromkeys(ratios, tolerance)
    bad = {n: r for n, r in ratios.items() if not r.ratio <= limit[n]}
    assert not bad, f"over {tolerance}: {_report(case, bad)}"


@pytest.mark.slow
@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("name", ["linear", "performer"])
def test_fla_s_linear_attention_reference_through_our_adapter_equals_our_scan(name, n):
    """fla's chunked reference in place of its Triton kernel, behind our adapter (features, the
    ones column, our eps), against the scan, our chunked kernel."""
    naive = _fla_naive("linear_attn")

    def op(q, k, v, *, scale, normalize):
        return naive.naive_chunk_linear_attn(q, k, v, scale=scale, normalize=normalize), None

    core = build_attention(name, causal=True, device="cpu", kernel="scan")
    q, k, v = (_draw(B, H, n, D, seed=s) for s in range(3))
    sums = core.sums_for(q)
    got = outputs_and_grads(lambda q, k, v: fla_sums(sums, q, k, v, None, op=op), [q, k, v])
    want = outputs_and_grads(lambda q, k, v: core(q, k, v), [q, k, v])
    _assert_within(f"{name} n={n}", compare(got, want, ["out", "dq", "dk", "dv"]), CPU_TOLERANCE)


def _decay_inputs(n: int, channel: bool) -> list[Tensor]:
    q, k, v = (_draw(B, H, n, D, seed=s) * D**-0.5 for s in range(3))
    shape = (B, H, n, D) if channel else (B, H, n)
    return [q, k, v, F.logsigmoid(4 + _draw(*shape, seed=3))]  # decays near 1: long memory


@pytest.mark.slow
@pytest.mark.parametrize("n", LENGTHS)
def test_fla_s_simple_gla_reference_equals_our_decay_chunks(n):
    """A scalar decay per head and token (RetNet, Mamba2's SSD): fla's chunked reference."""
    naive = _fla_naive("simple_gla")

    def fla(q, k, v, g):
        layout = [t.transpose(1, 2) for t in (q, k, v, g)]
        return naive.naive_chunk_simple_gla(*layout, scale=1.0)[0].transpose(1, 2)

    def ours(q, k, v, g):
        return chunk_decay(q, k, v, g, scale=1.0, chunk_length=64)[0]

    x = _decay_inputs(n, channel=False)
    got, want = outputs_and_grads(fla, x), outputs_and_grads(ours, x)
    ratios = compare(got, want, ["out", "dq", "dk", "dv", "dlog_decay"])
    _assert_within(f"simple_gla n={n}", ratios, CPU_TOLERANCE)


@pytest.mark.slow
@pytest.mark.parametrize("decay", [False, True], ids=["delta", "gated-delta"])
def test_fla_s_delta_rule_references_equal_our_delta_chunks(decay):
    """The delta rule at 4k only: fla's chunked references clone every chunk's (c, c) system once
    per row, which at 16k holds gigabytes for backward."""
    n, c = LENGTHS[0], 32
    q, k, v = (_draw(B, H, n, D, seed=s) for s in range(3))
    q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)  # unit keys: the delta rule is stable
    beta = torch.sigmoid(_draw(B, H, n, seed=4))
    x = [q, k, v, beta] + ([F.logsigmoid(4 + _draw(B, H, n, seed=5))] if decay else [])
    if decay:
        naive = _fla_naive("gated_delta_rule")

        def fla(q, k, v, beta, g):
            q, k, v, beta, g = (t.transpose(1, 2) for t in (q, k, v, beta, g))
            out = naive.naive_chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=c, scale=1.0)
            return out[0].transpose(1, 2)
    else:
        naive = _fla_naive("delta_rule")

        def fla(q, k, v, beta):  # it scales q by dk^-0.5 itself
            return naive.delta_rule_chunkwise(q, k, v, beta, chunk_size=c)[0]

    def ours(q, k, v, beta, g=None):
        scale = 1.0 if decay else D**-0.5
        return chunk_delta(q, k, v, beta, g, scale=scale, chunk_length=c)[0]

    got, want = outputs_and_grads(fla, x), outputs_and_grads(ours, x)
    names = ["out", "dq", "dk", "dv", "dbeta", "dlog_decay"][: len(got)]
    _assert_within(f"{'gated-' if decay else ''}delta n={n}", compare(got, want, names), 1e-4)


# ---- on CUDA: fla's Triton kernels against our exact implementations in float64 ----------------

# backend -> the implementation that is its reference at these lengths: the exact forms the
# kernel tests check against the quadratic sums and the token-by-token recurrence
FLA_BACKENDS = {
    "linear": "math",
    "performer": "math",
    "retention": "chunk",
    "gla": "chunk",
    "deltanet": "chunk",
    "gated-deltanet": "chunk",
}


def _reference(name: str, n: int) -> str:
    """The reference implementation of `name` at `n`: past 16k the quadratic form of linear and
    performer would need n x n float64 scores (32 GiB a head at 64k), so their chunked scan,
    exact too, stands in."""
    reference = FLA_BACKENDS[name]
    return "scan" if reference == "math" and n > LENGTHS[-1] else reference


@pytest.mark.parametrize("name", ["linear", "performer"])
def test_the_long_reference_is_the_exact_one_in_another_order(name):
    """At 64k the CUDA test measures linear and performer against their scan, not their quadratic
    form: in float64 the two give the same outputs and gradients."""
    assert _reference(name, CUDA_LENGTHS[-1]) == "scan" and _reference(name, LENGTHS[-1]) == "math"
    x = get_backend(name).layout().sample(B, 2, 512, 32, generator=torch.Generator().manual_seed(0))
    tensors = [t.double() for t in (x.q, x.k, x.v)]
    results = {}
    for kernel in ("scan", "math"):
        seeded = {"seed": 3} if "seed" in get_backend(name).defaults() else {}  # same features
        core = build_attention(name, causal=True, kernel=kernel, **seeded).double()
        results[kernel] = outputs_and_grads(lambda q, k, v, c=core: c(q, k, v), tensors)
    ratios = compare(results["scan"], results["math"], ["out", "dq", "dk", "dv"])
    assert all(r.ratio < 1e-12 for r in ratios.values()), ratios


def _record(row: dict) -> None:
    """One case's numbers as a JSON line in $ZOO_ACCURACY_OUT/fla-accuracy.jsonl (if set)."""
    if folder := os.environ.get("ZOO_ACCURACY_OUT"):
        Path(folder).mkdir(parents=True, exist_ok=True)
        with open(Path(folder, "fla-accuracy.jsonl"), "a") as f:
            f.write(json.dumps(row) + "\n")


@pytest.mark.gpu
@pytest.mark.parametrize("n", CUDA_LENGTHS)
@pytest.mark.parametrize("name", sorted(FLA_BACKENDS))
def test_fla_kernels_on_cuda_are_within_the_rms_tolerance(name, n):
    """The fla implementation's run on inputs rounded to bfloat16 (the dtype fla runs in here),
    against the reference implementation in float64 on the same values."""
    dtype = torch.bfloat16
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device; none is visible")
    pytest.importorskip("fla")
    layout = get_backend(name).layout()
    x = layout.sample(B, H, n, D, generator=torch.Generator().manual_seed(0))
    tensors = [t.to("cuda", dtype) for t in (x.q, x.k, x.v, *x.extras.values())]
    names = list(x.extras)
    seeded = {"seed": 3} if "seed" in get_backend(name).defaults() else {}  # the same features
    cores = {
        kernel: build_attention(name, causal=True, device="cuda", kernel=kernel, **seeded)
        for kernel in ("fla", _reference(name, n))
    }

    def run(kernel: str):
        core = cores[kernel]
        impl = type(core).kernels.by_name[kernel]
        return lambda q, k, v, *ex: impl.run(core, q, k, v, None, **dict(zip(names, ex)))

    row = {"backend": name, "kernel": "fla", "dtype": str(dtype).removeprefix("torch."),
           "length": n, "reference": f"{_reference(name, n)} float64"}  # fmt: skip
    # a refusal (no fla here, a shape its kernels do not take) is recorded and skipped
    fla = type(cores["fla"]).kernels.by_name["fla"]
    if refused := fla.reasons(cores["fla"], Call("cuda", dtype, n, D)):
        _record({**row, "refused": "; ".join(refused)})
        pytest.skip("; ".join(refused))
    try:
        got = outputs_and_grads(run("fla"), tensors)
        want = outputs_and_grads(run(_reference(name, n)), [t.double() for t in tensors])
    except Exception as error:
        _record({**row, "error": f"{type(error).__name__}: {error}"})
        raise
    ratios = compare(got, want, ["out", "dq", "dk", "dv", *(f"d{e}" for e in names)])
    tolerance = {**dict.fromkeys(ratios, EXTRA_TOLERANCE), **TOLERANCE}
    for tensor, r in ratios.items():
        _record({**row, "tensor": tensor, **r.row(), "passed": r.ratio <= tolerance[tensor]})
    _assert_within(f"{name} {row['dtype']} n={n}", ratios, tolerance)
