"""Every implementation of every backend against its family's reference (outputs and gradients,
padding, odd lengths, causal leak), the pick rule, FlexAttention's block lists, compiled Flex on
the CPU without recompiling, and fla's adapter. The same tests run on CUDA where one is present."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters
from torch.nn.attention.flex_attention import flex_attention

from attention_zoo import build_attention, list_backends
from attention_zoo.attention import dispatch
from attention_zoo.attention.dispatch import Call, Implementation, KernelTable
from attention_zoo.attention.kernels import fla_package
from attention_zoo.attention.kernels.compiled import run_compiled
from attention_zoo.attention.kernels.dense import dense_attention
from attention_zoo.attention.kernels.flex import (
    TILE,
    chunk_window_tiles,
    run_flex,
    structural_block_mask,
    tiles,
)
from attention_zoo.attention.kernels.patterns.reference import pattern_reference
from attention_zoo.attention.kernels.rounds.lsh_hashing import sort_by_bucket
from attention_zoo.attention.kernels.rounds.reference import lsh_reference
from attention_zoo.attention.kernels.routing.flex_routed import route_block_mask
from attention_zoo.attention.kernels.routing.reference import routed_reference
from attention_zoo.attention.kernels.routing.route import block_means
from attention_zoo.attention.kernels.sums.fla import fla_sums
from attention_zoo.attention.kernels.sums.reference import quadratic_sums
from attention_zoo.attention.moba import moba_route
from attention_zoo.errors import OptionError, UnavailableError
from attention_zoo.measure.accuracy import compare, outputs_and_grads

from .contract import with_grads

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
N = 45  # odd, not a multiple of any chunk, block or tile


def slow_after_first(cases: list, ids: list[str]) -> list:
    """The first case in the quick pass, the others under the slow marker (CI runs them all)."""
    return [
        pytest.param(*case, id=i, marks=() if not n else pytest.mark.slow)
        for n, (case, i) in enumerate(zip(cases, ids))
    ]


def _device(device: str) -> torch.dtype:
    """The most exact dtype every implementation takes there (flex on CUDA: no float64)."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device; none is visible")
    return torch.float64 if device == "cpu" else torch.float32


def _tol(dtype: torch.dtype) -> dict[str, float]:
    return (
        {"atol": 1e-10, "rtol": 1e-10} if dtype == torch.float64 else {"atol": 2e-5, "rtol": 2e-5}
    )


def _padding(b: int, n: int, device: str) -> torch.Tensor:
    mask = torch.ones(b, n, dtype=torch.bool, device=device)
    mask[0, n - 12 :] = False  # the end
    mask[1, 3:9] = False  # inside
    return mask


def _implementations(name: str, options: dict, causal: bool, device: str, dtype: torch.dtype):
    """(implementation name, core) for every implementation of `name` that runs here."""
    core = build_attention(name, causal=causal, device=device, **options)
    call = Call(device, dtype, N, 16)
    for impl in type(core).kernels.implementations:
        if not impl.reasons(core, call):
            yield (
                impl.name,
                build_attention(name, causal=causal, device=device, kernel=impl.name, **options),
            )


# ---- fixed patterns: a softmax under the core's mask_mod ------------------------------------

PATTERNS = [
    ("local", {"chunk_length": 8}),
    ("local", {"chunk_length": 8, "num_chunks_after": 1}),
    ("sliding-window", {"window": 8}),
    ("sliding-window", {"window": 8, "global_tokens": 3}),
    ("bigbird", {"block_size": 4, "num_global_blocks": 1, "num_random_blocks": 2}),
]
PATTERN_IDS = [f"{n}-{'-'.join(f'{k}{v}' for k, v in o.items())}" for n, o in PATTERNS]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("name", "options"), slow_after_first(PATTERNS, PATTERN_IDS))
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_every_pattern_implementation_equals_the_dense_masked_softmax(
    name, options, causal, device
):
    dtype = _device(device)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, N, 16, generator=g, dtype=dtype).to(device) for _ in range(3))
    mask = _padding(2, N, device)
    seen = []
    for kernel, core in _implementations(name, options, causal, device, dtype):
        seen.append(kernel)
        rows = (core.pattern(N, device)[None, None] & mask[:, None, None, :]).any(-1, keepdim=True)

        def ours(q, k, v, core=core, rows=rows):  # a query with no key to see: no defined output
            return core(q, k, v, key_padding_mask=mask) * rows

        def reference(q, k, v, core=core):
            return pattern_reference(core, q, k, v, mask)

        out, grads = with_grads(ours, [q, k, v])
        ref, ref_grads = with_grads(reference, [q, k, v])
        torch.testing.assert_close(out, ref, **_tol(dtype), msg=lambda m, k=kernel: f"{k}: {m}")
        for got, want in zip(grads, ref_grads):
            torch.testing.assert_close(got, want, **_tol(dtype))
    assert "flex" in seen and "math" in seen, seen


# ---- sorted rounds: exact LSH against its dense per-round reference -------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("hashes", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_every_lsh_implementation_equals_the_per_round_reference(causal, hashes, device):
    """Each kernel of exact LSH on the same sort: a dense softmax per round over the keys of its
    bucket in its window, merged by log-sum-exp (float64; padding at the ends and inside)."""
    dtype = _device(device)
    options = dict(chunk_length=8, num_hashes=hashes, num_buckets=4, seed=7, num_chunks_after=1)
    g = torch.Generator().manual_seed(1)
    q, v = (torch.randn(2, 3, N, 16, generator=g, dtype=dtype).to(device) for _ in range(2))
    mask = _padding(2, N, device)
    seen = []
    for kernel, core in _implementations("lsh", options, causal, device, dtype):
        seen.append(kernel)

        def reference(q, v, core=core):
            npad = -(-N // 8) * 8
            qp, vp = (torch.nn.functional.pad(t, (0, 0, 0, npad - N)) for t in (q, v))
            with torch.no_grad():  # the core's own hashing: the same buckets
                perm, sorted_buckets = sort_by_bucket(core._hash(qp, N, mask))
            out = lsh_reference(
                qp, qp, vp, perm, sorted_buckets, chunk=8, before=1,
                after=0 if causal else 1, causal=causal,
            )  # fmt: skip
            return out[:, :, :N]

        (out, grads) = with_grads(
            lambda q, v, core=core: core(q, q, v, key_padding_mask=mask), [q, v]
        )
        (ref, ref_grads) = with_grads(reference, [q, v])
        torch.testing.assert_close(out, ref, **_tol(dtype), msg=lambda m, k=kernel: f"{k}: {m}")
        for got, want in zip(grads, ref_grads):
            torch.testing.assert_close(
                got, want, **_tol(dtype), msg=lambda m, k=kernel: f"{k}: {m}"
            )
    assert {"flex", "math"} <= set(seen), seen


# ---- kernelised sums: the quadratic form ------------------------------------------------------

SUMS = [
    ("linear", {"chunk_length": 8}),
    ("linear", {"chunk_length": 8, "feature_map": "relu"}),
    ("performer", {"chunk_length": 8, "nb_features": 24, "seed": 3}),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("name", "options"), slow_after_first(SUMS, ["linear", "linear-relu", "performer"])
)
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_every_sums_implementation_equals_the_quadratic_form(name, options, causal, device):
    dtype = _device(device)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 3, N, 16, generator=g, dtype=dtype).to(device) for _ in range(3))
    mask = _padding(2, N, device)
    seen = []
    for kernel, core in _implementations(name, options, causal, device, dtype):
        seen.append(kernel)
        sums = core.sums_for(q)

        def ours(q, k, v, core=core):
            return core(q, k, v, key_padding_mask=mask)

        def reference(q, k, v, sums=sums):
            return quadratic_sums(sums, q, k, v, mask)

        (out, grads), (ref, ref_grads) = (
            with_grads(ours, [q, k, v]),
            with_grads(reference, [q, k, v]),
        )
        torch.testing.assert_close(out, ref, **_tol(dtype), msg=lambda m, k=kernel: f"{k}: {m}")
        for got, want in zip(grads, ref_grads):
            torch.testing.assert_close(got, want, **_tol(dtype))
    assert {"scan", "math"} <= set(seen) or device == "cuda", seen


def _unnormalised_linear(q, k, v, *, scale, normalize):
    """fla's chunk_linear_attn contract in plain PyTorch: (b, n, h, *) in and out, causal,
    unnormalised: what the adapter's numerator and denominator come from."""
    assert not normalize
    scores = torch.einsum("bihm,bjhm->bhij", q * scale, k).tril()
    return torch.einsum("bhij,bjhd->bihd", scores, v), None


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("name", "options"), SUMS, ids=["linear", "linear-relu", "performer"])
def test_the_fla_adapter_equals_the_quadratic_form(name, options, dtype):
    """Layout, features (float32 for 16-bit inputs), the ones column (padded to an even width) and
    our eps, with a plain op of fla's contract standing in for its Triton kernel."""
    core = build_attention(name, causal=True, device="cpu", **options)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, N, 16, generator=g).to(dtype) for _ in range(3))
    mask = _padding(2, N, "cpu")
    sums = core.sums_for(q)
    out, grads = with_grads(
        lambda q, k, v: fla_sums(sums, q, k, v, mask, op=_unnormalised_linear), [q, k, v]
    )
    ref, ref_grads = with_grads(lambda q, k, v: quadratic_sums(sums, q, k, v, mask), [q, k, v])
    for got, want in zip([out, *grads], [ref, *ref_grads]):
        if dtype == torch.float64:
            torch.testing.assert_close(got, want, **_tol(dtype))
        else:  # features and values rounded to bfloat16: within a few of its steps of the scale
            error = (got.float() - want.float()).abs().max() / want.float().abs().max()
            assert error < 2e-2, error


@pytest.mark.slow  # importing fla takes seconds
def test_the_fla_adapter_equals_the_quadratic_form_with_fla_s_own_reference():
    """fla's plain reference (`fla.ops.linear_attn.naive`) in place of its kernel."""
    pytest.importorskip("triton", reason="fla's package imports Triton")
    naive = pytest.importorskip("fla.ops.linear_attn.naive")

    def op(q, k, v, *, scale, normalize):
        return naive.naive_recurrent_linear_attn(q, k, v, scale=scale, normalize=normalize)

    core = build_attention("performer", causal=True, device="cpu", nb_features=24, seed=3)
    q, k, v = (torch.randn(2, 3, N, 16, dtype=torch.float64) for _ in range(3))
    sums = core.sums_for(q)
    got = fla_sums(sums, q, k, v, None, op=op)
    torch.testing.assert_close(got, quadratic_sums(sums, q, k, v, None), atol=1e-6, rtol=1e-6)


# ---- low rank --------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("name", "options"),
    [("nystrom", {"num_landmarks": 8}), ("linformer", {"proj_length": 16, "max_length": 64})],
)
def test_every_low_rank_implementation_equals_the_plain_formula(name, options, device):
    dtype = _device(device)
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 3, N, 16, generator=g, dtype=dtype).to(device) for _ in range(3))
    mask = _padding(2, N, device)
    weights = build_attention(name, device=device, **options).state_dict()  # one projection
    runs = {}
    for kernel, core in _implementations(name, options, False, device, dtype):
        core.load_state_dict(weights)
        runs[kernel] = with_grads(
            lambda q, k, v, c=core: c(q, k, v, key_padding_mask=mask), [q, k, v]
        )
    (ref, ref_grads) = runs.pop("math")
    for kernel, (out, grads) in runs.items():
        torch.testing.assert_close(out, ref, **_tol(dtype), msg=lambda m, k=kernel: f"{k}: {m}")
        for got, want in zip(grads, ref_grads):
            torch.testing.assert_close(got, want, **_tol(dtype))


@pytest.mark.parametrize(
    ("name", "options"),
    [("nystrom", {"num_landmarks": 8}), ("linformer", {"proj_length": 16, "max_length": 64})],
)
def test_the_sdpa_low_rank_kernels_keep_16_bit_inputs_near_the_float64_formula(name, options):
    """sdpa runs its n-long products in bfloat16 and Nystrom's pseudo-inverse in float32 (in
    bfloat16 the gradients reach a ratio of 0.03): outputs and gradients against the float64
    formula on the same rounded inputs, by RMS ratio."""
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(2, 3, 64, 16, generator=g).to(torch.bfloat16) for _ in range(3))
    sdpa = build_attention(name, kernel="sdpa", **options)
    math = build_attention(name, kernel="math", **options)
    math.load_state_dict(sdpa.state_dict())
    got = outputs_and_grads(sdpa, [q, k, v])
    want = outputs_and_grads(math.double(), [t.double() for t in (q, k, v)])
    ratios = compare(got, want, ["out", "dq", "dk", "dv"])
    assert all(r.ratio < 2e-2 for r in ratios.values()), ratios


# ---- causal leak, per implementation ------------------------------------------------------------

CAUSAL = [
    ("local", {"chunk_length": 8}),
    ("sliding-window", {"window": 8, "global_tokens": 2}),
    ("bigbird", {"block_size": 4, "num_global_blocks": 1, "num_random_blocks": 2}),
    ("lsh", {"chunk_length": 8, "num_hashes": 2, "num_buckets": 4, "seed": 7}),
    ("linear", {"chunk_length": 8}),
    ("performer", {"chunk_length": 8, "nb_features": 24, "seed": 3}),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("name", "options"), slow_after_first(CAUSAL, [n for n, _ in CAUSAL]))
def test_no_implementation_leaks_later_tokens(name, options, device):
    dtype = _device(device)
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, N, 16, generator=g, dtype=dtype).to(device) for _ in range(3))
    shared = name == "lsh"
    for kernel, core in _implementations(name, options, True, device, dtype):
        base = core(q, q if shared else k, v)
        for i in (0, 9, 30):
            later = [t.clone() for t in (q, k, v)]
            for t in later:
                t[:, :, i + 1 :] = torch.randn_like(t[:, :, i + 1 :]) * 3
            out = core(later[0], later[0] if shared else later[1], later[2])
            atol = 1e-12 if dtype == torch.float64 else 1e-6
            torch.testing.assert_close(
                out[:, :, : i + 1], base[:, :, : i + 1], atol=atol, rtol=0,
                msg=lambda m, k=kernel, i=i: f"{k}: tokens after {i} changed it: {m}",
            )  # fmt: skip


# ---- the pick rule ----------------------------------------------------------------------------

CPU_AUTO = {
    "full": "math",
    "shared-qk": "math",
    "local": "cpu-fused",
    "lsh": "cpu-fused",
    "sliding-window": "cpu-fused",
    "bigbird": "cpu-fused",
    "linear": "scan",
    "performer": "scan",
    "nystrom": "math",
    "differential": "cpu-fused",
    "linformer": "cpu-fused",
    "moba": "tiled",
    "nsa": "tiled",
}


# where the CPU's best differs in bfloat16: the low-rank cores' SDPA calls in the input's dtype
# (faster and 2-3.6x leaner than the float32 forms there, measured: docs/backends.md)
CPU_BF16_AUTO = {"nystrom": "sdpa", "linformer": "sdpa"}


@pytest.mark.parametrize("name", sorted(CPU_AUTO))
def test_auto_on_the_cpu_keeps_the_cpu_kernels(name):
    causal = name not in ("nystrom", "linformer")
    core = build_attention(name, causal=causal, device="cpu")
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        expected = CPU_BF16_AUTO.get(name, CPU_AUTO[name])
        expected = expected if dtype == torch.bfloat16 else CPU_AUTO[name]
        assert core.pick(Call("cpu", dtype, 4096, 64)).name == expected
        # meta (shapes only: memory and FLOP predictions) stands in for the CPU
        assert core.pick(Call("meta", dtype, 4096, 64, fake=True)).name == expected


def test_a_dtype_s_own_priority_list_comes_first_and_names_a_real_device_and_dtype():
    def run(*args):
        raise AssertionError("never run")

    a, b = (Implementation(name=n, summary=n, run=run) for n in ("a", "b"))
    table = KernelTable((a, b), {"cpu": ("a", "b"), "cpu:bfloat16": ("b", "a")})
    assert [table.preference(Call("cpu", t, 64, 8)) for t in (torch.float32, torch.bfloat16)] == [
        ("a", "b"),
        ("b", "a"),
    ]
    assert table.pick("x", "auto", None, Call("cpu", torch.bfloat16, 64, 8)).name == "b"
    with pytest.raises(ValueError, match=r"\['cpu:bf16'\] name no dtype"):
        KernelTable((a, b), {"cpu:bf16": ("a",)})
    with pytest.raises(ValueError, match=r"\['cdua:bfloat16'\] name no torch device type"):
        KernelTable((a, b), {"cdua:bfloat16": ("a",)})  # a misspelt device: never consulted


def test_a_table_s_plain_implementation_is_one_of_its_own():
    """The one fair-comparison FLOPs count: a misspelt name would count auto's pick instead."""
    a, b = (Implementation(name=n, summary=n, run=print) for n in ("a", "b"))
    with pytest.raises(ValueError, match=r"unknown or repeated names \['c'\]"):
        KernelTable((a, b), {"cpu": ("a",)}, plain="c")
    assert KernelTable((a, b), {"cpu": ("a",)}, plain="b").replacing("a").plain == "b"
    assert KernelTable((a, b), {"cpu": ("a",)}).plain == "math"  # a table without one: auto


def test_meta_picks_as_the_cpu_unless_a_table_keeps_lists_for_meta():
    def run(*args):
        raise AssertionError("never run")

    a, b = (Implementation(name=n, summary=n, run=run) for n in ("a", "b"))
    cpu = {"cpu": ("a", "b"), "cpu:bfloat16": ("b", "a"), "cuda": ("b",)}
    meta = [Call("meta", t, 64, 8, fake=True) for t in (torch.float32, torch.bfloat16)]
    assert [KernelTable((a, b), cpu).preference(c) for c in meta] == [("a", "b"), ("b", "a")]
    own = KernelTable((a, b), {**cpu, "meta": ("b",)})  # meta standing in for another device
    assert [own.preference(c) for c in meta] == [("b",), ("b",)]


def test_auto_passes_over_an_implementation_that_does_not_pay_but_a_named_one_runs():
    def run(*args):
        raise AssertionError("never run")

    long_only = Implementation(
        name="tiles", summary="", run=run, pays=lambda core, c: c.length > 99
    )
    dense = Implementation(name="dense", summary="", run=run)
    bf16 = Implementation(name="bf16", summary="", run=run, dtypes=frozenset({torch.bfloat16}))
    table = KernelTable(
        (long_only, dense, bf16), {"cpu": ("tiles", "dense"), "cuda": ("tiles", "bf16")}
    )
    short, long = Call("cpu", torch.float32, 64, 8), Call("cpu", torch.float32, 128, 8)
    assert [table.pick("x", "auto", None, c).name for c in (short, long)] == ["dense", "tiles"]
    assert table.pick("x", "tiles", None, short).name == "tiles"  # named: it can, so it runs
    # where nothing after it can run, the first that can runs, paying or not
    assert table.pick("x", "auto", None, Call("cuda", torch.float32, 64, 8)).name == "tiles"


@pytest.fixture
def triton_present(monkeypatch):
    """As on a CUDA machine with Triton and fla-core."""
    monkeypatch.setattr(dispatch, "has_triton", lambda: True)
    monkeypatch.setattr(fla_package, "fla_reason", lambda: None)
    dispatch.compile_reason.cache_clear()
    yield
    dispatch.compile_reason.cache_clear()


CUDA_AUTO = [
    ("local", {}, True, "flex"),
    ("local", {"semantics": "hf"}, True, "math"),
    ("sliding-window", {}, True, "flex"),
    ("bigbird", {}, False, "flex"),
    ("lsh", {"num_hashes": 4}, True, "flex"),
    ("lsh", {"semantics": "hf"}, True, "math"),
    ("linear", {}, True, "math"),
    ("linear", {}, False, "math"),
    ("performer", {}, True, "math"),
    ("nystrom", {}, False, "sdpa"),
    ("linformer", {}, False, "sdpa"),
    ("moba", {}, True, "flex"),
    ("nsa", {}, True, "flex"),
]


@pytest.mark.parametrize(("name", "options", "causal", "expected"), CUDA_AUTO)
def test_auto_on_cuda_takes_the_library_kernels(triton_present, name, options, causal, expected):
    core = build_attention(name, causal=causal, device="meta", **options)
    assert core.pick(Call("cuda", torch.bfloat16, 16384, 64)).name == expected


@pytest.mark.parametrize("name", ["linear", "performer"])
def test_fla_sums_take_bfloat16_only(triton_present, name):
    """fla's Triton products of float32 inputs run in TF32, and in float16 performer's features
    underflow and linear attention's sums overflow: those run the exact sums; fla by name refuses
    them."""
    for dtype in (torch.float32, torch.float16):
        core = build_attention(name, causal=True, device="meta")
        assert core.pick(Call("cuda", dtype, 16384, 64)).name == "math"
        named = build_attention(name, causal=True, device="meta", kernel="fla")
        with pytest.raises(UnavailableError, match=f"takes bfloat16, not {str(dtype)[6:]}"):
            named.pick(Call("cuda", dtype, 16384, 64))
    named = build_attention(name, causal=True, device="meta", kernel="fla")
    assert named.pick(Call("cuda", torch.bfloat16, 16384, 64)).name == "fla"


def test_dropout_falls_back_with_auto_and_a_named_kernel_refuses_in_one_line():
    q = torch.randn(1, 2, N, 16)
    auto = build_attention("local", causal=True, device="cpu", chunk_length=8, dropout=0.1)
    assert (
        auto.train().kernel_for(q).name == "math" and auto.eval().kernel_for(q).name == "cpu-fused"
    )
    named = build_attention(
        "local", causal=True, device="cpu", chunk_length=8, dropout=0.1, kernel="cpu-fused"
    )
    named.train()
    with pytest.raises(UnavailableError) as err:
        named(q, q, q)
    message = str(err.value)
    assert "\n" not in message
    assert "kernel='cpu-fused' cannot run here: applies no attention dropout" in message
    assert "use kernel='auto' (picks math)" in message


@pytest.mark.parametrize(
    ("name", "options", "reason"),
    [
        ("linear", {"kernel": "fla"}, "runs on cuda, not cpu"),
        ("nystrom", {"kernel": "compiled"}, "runs on cuda, not cpu"),
        ("local", {"kernel": "flex", "semantics": "hf"}, "computes no fixed pattern"),
        ("lsh", {"kernel": "flex", "semantics": "hf"}, "runs the exact semantics only"),
        ("lsh", {"kernel": "cpu-fused", "semantics": "hf", "num_chunks_before": 5}, "reach past"),
    ],
)
def test_a_named_kernel_that_cannot_run_says_why(name, options, reason):
    chunked = {"chunk_length": 8} if name in ("local", "lsh") else {}
    core = build_attention(name, causal=name != "nystrom", device="cpu", **chunked, **options)
    q = torch.randn(1, 2, 12, 16)
    with pytest.raises(UnavailableError, match=reason):
        core(q, q, q)


def test_an_unknown_kernel_is_refused_with_the_known_ones():
    with pytest.raises(
        OptionError, match="linear kernel 'flash' is not one of: auto, scan, math, fla"
    ):
        build_attention("linear", kernel="flash")


@pytest.mark.parametrize("spec", list_backends(), ids=lambda s: s.name)
def test_build_attention_puts_every_parameter_and_buffer_on_its_device(spec):
    if spec.unavailable_reason("meta"):
        pytest.skip(spec.unavailable_reason("meta"))
    causal = spec.caps.causal
    core = build_attention(spec.name, causal=causal, device="meta")
    tensors = [*core.parameters(), *core.buffers()]
    assert all(t.device.type == "meta" for t in tensors), [t.device for t in tensors]


# ---- FlexAttention's block lists ----------------------------------------------------------------


def _dense_tiles(allowed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(any, every) allowed pair per (query tile, key tile) of a dense (n, n) mask."""
    n = allowed.shape[-1]
    nt = tiles(n)
    pad = nt * TILE - n
    some = torch.nn.functional.pad(allowed, (0, pad, 0, pad), value=False)
    every = torch.nn.functional.pad(allowed, (0, pad, 0, pad), value=True)
    every[n:, :] = True
    every[:, n:] = False  # a key beyond the end is not allowed
    shape = (nt, TILE, nt, TILE)
    return some.view(shape).any(3).any(1), every.view(shape).all(3).all(1)


def _lists(block_mask) -> tuple[torch.Tensor, torch.Tensor]:
    """(partial, full) tiles of a block mask as dense (query tiles, key tiles) bools."""

    def listed(counts, indices) -> torch.Tensor:
        dense = torch.zeros(indices.shape[-2:], dtype=torch.bool)
        for i, count in enumerate(counts[0, 0].tolist()):
            dense[i, indices[0, 0, i, :count].long()] = True
        return dense

    partial = listed(block_mask.kv_num_blocks, block_mask.kv_indices)
    if block_mask.full_kv_num_blocks is None:
        return partial, torch.zeros_like(partial)
    return partial, listed(block_mask.full_kv_num_blocks, block_mask.full_kv_indices)


@pytest.mark.parametrize("n", [45, 300, 700])
@pytest.mark.parametrize(
    ("name", "options"),
    [
        *PATTERNS,
        ("local", {}),
        ("local", {"chunk_length": 100, "num_chunks_after": 2}),  # chunks that do not divide
        ("local", {"chunk_length": 300, "num_chunks_before": 2}),  # a tile, nor a tile them
        ("sliding-window", {"window": 300}),
        ("bigbird", {}),
    ],
)
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_block_lists_hold_exactly_the_tiles_with_allowed_pairs(name, options, causal, n):
    """Eager Flex computes densely and ignores the block lists: they are checked here. Every tile
    with an allowed pair is listed, none without; a full tile (no mask_mod in the kernel) has
    every pair allowed; no tile is both."""
    core = build_attention(name, causal=causal, device="cpu", **options)
    some, every = _dense_tiles(core.pattern(n))
    partial, full = _lists(core.tile_masks(n, torch.device("cpu")).with_full)
    assert torch.equal(partial | full, some)
    assert not (partial & full).any()
    assert torch.equal(full, some & every)
    partial, full = _lists(core.tile_masks(n, torch.device("cpu")).all_partial)  # padded calls
    assert torch.equal(partial, some) and not full.any()


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("length", [48, 304, 1024])
@pytest.mark.parametrize("chunk", [16, 100])
def test_lsh_block_lists_cover_every_window_of_the_sorted_rounds(causal, length, chunk):
    """The sorted sequence's block lists come from its chunk structure alone: every (query, key)
    slot pair its windows allow, whatever the buckets, lies in a listed tile."""
    after = 0 if causal else 1
    structure = structural_block_mask(
        chunk_window_tiles(length, chunk, 1, after, causal, "cpu"), length
    )
    i = torch.arange(length)
    si, sj = i[:, None], i[None, :]
    if causal:
        window = (sj < si) & (sj >= si - chunk)
    else:
        qc, kc = si // chunk, sj // chunk
        window = (kc >= qc - 1) & (kc <= qc + after) & (si != sj)
    some, _ = _dense_tiles(window)
    partial, full = _lists(structure)
    assert not full.any()
    assert not (some & ~partial).any(), "a window pair outside the listed tiles"


# ---- compiled Flex on the CPU (forward): block sparsity for real, no recompiles -----------------


@pytest.mark.long
@pytest.mark.slow  # each compile takes ~10 s on 2 cores
def test_compiled_flex_on_the_cpu_equals_the_dense_pattern_and_compiles_once():
    n = 600
    core = build_attention("local", causal=True, device="cpu")
    other = build_attention("local", causal=True, device="cpu")  # same options, another module
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 2, n, 64, generator=g) for _ in range(3))
    torch._dynamo.reset()
    graphs = []
    for attn, cut in [(core, 500), (core, 500), (core, 420), (other, 460)]:
        mask = torch.ones(1, n, dtype=torch.bool)
        mask[0, cut:] = False
        before = counters["stats"]["unique_graphs"]
        with torch.no_grad():
            block_mask = attn.tile_masks(n, q.device).for_call(mask)
            out = _compiled_on_cpu(q, k, v, block_mask)
        graphs.append(counters["stats"]["unique_graphs"] - before)
        allowed = attn.pattern(n)[None, None] & mask[:, None, None, :]
        ref = dense_attention(q, k, v, allowed, scale=0.125) * allowed.any(-1, keepdim=True)
        torch.testing.assert_close(out * allowed.any(-1, keepdim=True), ref, atol=2e-6, rtol=2e-6)
    assert graphs == [1, 0, 0, 0], graphs  # other padding values, another module: nothing new


@pytest.mark.long
@pytest.mark.slow  # one compile: seconds on 2 cores
def test_compiled_flex_follows_each_route_without_recompiling():
    """moba's routes as compiled FlexAttention block masks on the CPU: other inputs (so other
    selected blocks) and other padding reuse the one compiled kernel, and each equals the dense
    reference under its route."""
    n = 600
    g = torch.Generator().manual_seed(7)
    torch._dynamo.reset()
    graphs = []
    for cut in (600, 600, 500):
        q, k, v = (torch.randn(1, 2, n, 64, generator=g) for _ in range(3))
        real = torch.ones(1, n, dtype=torch.bool)
        real[0, cut:] = False
        means, has = block_means(k, real, 64)
        route = moba_route(q, means, has, block=64, top_k=3)
        before = counters["stats"]["unique_graphs"]
        with torch.no_grad():
            out = _compiled_on_cpu(q, k, v, route_block_mask(route, n, real))
        graphs.append(counters["stats"]["unique_graphs"] - before)
        want = routed_reference(q, k, v, route, real)
        torch.testing.assert_close(out, want, atol=2e-6, rtol=2e-6)
    assert graphs == [1, 0, 0], graphs


def _compiled_on_cpu(q, k, v, block_mask):
    """The compiled flex_attention the cores use on CUDA, on the CPU (forward only there)."""
    return run_compiled(flex_attention, q, k, v, block_mask=block_mask, scale=0.125)


def test_run_flex_gives_the_natural_log_sum_exp():
    core = build_attention("local", causal=True, device="cpu", chunk_length=8)
    q, k, v = (torch.randn(1, 2, N, 16, dtype=torch.float64) for _ in range(3))
    out, lse = run_flex(q, k, v, core.tile_masks(N, q.device).with_full, scale=0.25, lse=True)
    scores = (q @ k.transpose(-1, -2) * 0.25).masked_fill(~core.pattern(N), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1), atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(out, scores.softmax(-1) @ v, atol=1e-12, rtol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "options"), SUMS, ids=["linear", "linear-relu", "performer"])
def test_fla_on_cuda_stays_near_the_quadratic_form(name, options):
    """fla's Triton kernel (bfloat16 features and values, float32 sums) against the float32
    quadratic form: within bfloat16's rounding of the output's scale, outputs and gradients."""
    _device("cuda")
    core = build_attention(name, causal=True, device="cuda", kernel="fla", **options)
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(2, 3, 300, 16, generator=g).cuda() for _ in range(3))
    mask = _padding(2, 300, "cuda")
    out, grads = with_grads(
        lambda q, k, v: core(q, k, v, key_padding_mask=mask), [t.bfloat16() for t in (q, k, v)]
    )
    sums = core.sums_for(q)
    ref, ref_grads = with_grads(lambda q, k, v: quadratic_sums(sums, q, k, v, mask), [q, k, v])
    for got, want in zip([out, *grads], [ref, *ref_grads]):
        error = (got.float() - want).abs().max() / want.abs().max()
        assert error < 3e-2, f"{name}: bfloat16 relative error {error:.3g}"


@pytest.mark.slow
def test_the_implementation_that_ran_is_stored_and_shown(tmp_path):
    """Each case's facts name the implementation its cores ran; the bench and results tables show
    it in their kernel column."""
    from attention_zoo.measure.cases import BenchCase
    from attention_zoo.measure.runner import MeasureSettings, measure_case
    from attention_zoo.measure.table import comparison_table, group_cases
    from attention_zoo.store import open_store

    settings = MeasureSettings(metrics=("time",), time_budget_s=0.0, min_repeats=1)
    results = [
        measure_case(BenchCase(target=t, backend=b, seq_len=64, options=o), settings)
        for t, b, o in [
            ("attention", "local", {}),
            ("block", "linear", {"kernel": "math"}),
            ("model", "lsh", {}),
        ]
    ]
    assert [r.facts.get("kernels") for r in results] == [
        {"local": "cpu-fused"},
        {"linear": "math"},
        {"lsh": "cpu-fused"},
    ]
    with open_store(tmp_path / "zoo.sqlite", write=True) as store:
        run = store.start_run(kind="bench", device="cpu")
        for r in results:
            store.add_rows(run, None, r.case.to_dict(), r.rows, status=r.status, facts=r.facts)
        rows = store.rows(run_id=run)
    table = comparison_table(group_cases(rows)).splitlines()
    assert " kernel " in table[0]
    assert any(" cpu-fused " in line and " local " in line for line in table)
    assert any(" math " in line and " linear(kernel=math) " in line for line in table)


@pytest.mark.long
@pytest.mark.slow  # compiling the forward and backward takes ~20 s on 2 cores
def test_compiled_nystrom_equals_its_plain_formula():
    """The CUDA implementation is the plain function through torch.compile: the same function,
    outputs and gradients, compiled here on the CPU."""
    core = build_attention("nystrom", device="cpu", num_landmarks=8)
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(2, 3, N, 16, generator=g) for _ in range(3))
    mask = _padding(2, N, "cpu")
    torch._dynamo.reset()
    out, grads = with_grads(lambda *t: core._nystrom(*t, mask, compiled=True), [q, k, v])
    ref, ref_grads = with_grads(lambda *t: core._nystrom(*t, mask, compiled=False), [q, k, v])
    for got, want in zip([out, *grads], [ref, *ref_grads]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_a_plugin_keeps_its_own_kernel_values_and_gets_flex_for_its_pattern(triton_present):
    """A plugin core with a kernel option of its own: a value the pick rule does not name is its
    attend's; with a fixed pattern, flex stands in on CUDA under auto, and can be named."""
    from dataclasses import dataclass

    from attention_zoo import AttentionCore, Capabilities, register_attention
    from attention_zoo.attention.spec import BACKENDS

    @dataclass(frozen=True, kw_only=True)
    class BandConfig:
        kernel: str = "mine"

    @register_attention(
        "test-band", config=BandConfig, caps=Capabilities(exact=False, fixed_pattern=True)
    )
    class Band(AttentionCore):
        def mask_mod(self, n, device="cpu"):
            return lambda i, j: ((i - j).abs() < 4) & (j <= i)

        def attend(self, q, k, v, key_padding_mask):
            return pattern_reference(self, q, k, v, key_padding_mask)

    try:
        own = build_attention("test-band", causal=True, device="cpu")
        assert own.requested_kernel == "attend"
        flex = build_attention("test-band", causal=True, device="cpu", kernel="flex")
        q = torch.randn(1, 2, N, 16, dtype=torch.float64)
        assert flex.kernel_for(q).name == "flex" and own.kernel_for(q).name == "attend"
        torch.testing.assert_close(flex(q, q, q), own(q, q, q), atol=1e-12, rtol=1e-12)
        cuda = Call("cuda", torch.bfloat16, 4096, 64)
        auto = build_attention("test-band", causal=True, device="cpu", kernel="auto")
        assert auto.pick(cuda).name == "flex" and own.pick(cuda).name == "attend"
        kernels = BACKENDS.get("test-band").kernels_on("cpu")
        assert [(k["name"], k["auto"]) for k in kernels] == [("attend", True), ("flex", False)]
    finally:
        BACKENDS.remove("test-band")


def test_zoo_list_shows_no_kernels_for_a_plugin_it_cannot_build_with_defaults():
    from dataclasses import dataclass

    from attention_zoo import AttentionCore, register_attention
    from attention_zoo.attention.spec import BACKENDS

    @dataclass(frozen=True, kw_only=True)
    class NeedsConfig:
        width: int  # required

    @register_attention("test-needs", config=NeedsConfig)
    class Needs(AttentionCore):
        def attend(self, q, k, v, key_padding_mask):
            return v

    try:
        assert BACKENDS.get("test-needs").describe("cpu")["kernels"] == []
    finally:
        BACKENDS.remove("test-needs")
