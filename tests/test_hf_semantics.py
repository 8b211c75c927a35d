"""`semantics="hf"`: `lsh` and `local` equal transformers' LSHSelfAttention / LocalSelfAttention
given the same projections and the same rotations (hash_seed, or the same global RNG state), at
lengths that fit one chunk, are whole chunks or not, with and without a left-padded mask."""

from __future__ import annotations

import functools
import itertools
from types import ModuleType, SimpleNamespace

import pytest
import torch

from attention_zoo import OptionError, UnavailableError, build_attention
from attention_zoo.attention.kernels.rounds.circular import CircularPlan, consecutive_reason
from attention_zoo.attention.kernels.rounds.lsh_hashing import auto_buckets
from attention_zoo.attention.kernels.rounds.rows import undo_perm

pytest.importorskip("transformers", reason="transformers is not installed")


@functools.cache
def reformer() -> ModuleType:
    """transformers' Reformer modelling module, imported when a test first needs it (not while
    the tests are collected: it takes seconds)."""
    return pytest.importorskip("transformers.models.reformer.modeling_reformer")


B, H, D, C = 2, 2, 8, 8  # batch, heads, head size, chunk


def _split(t: torch.Tensor) -> torch.Tensor:
    return t.view(t.shape[0], t.shape[1], H, D).transpose(1, 2)


def _merge(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(1, 2).reshape(t.shape[0], t.shape[2], H * D)


def _config(**fields):
    from transformers import ReformerConfig

    return ReformerConfig(
        hidden_size=H * D,
        num_attention_heads=H,
        attention_head_size=D,
        lsh_attention_probs_dropout_prob=0.0,
        local_attention_probs_dropout_prob=0.0,
        **fields,
    )


def _hf_run(module, x, mask, n):
    """HF on x padded to whole chunks (as HF's model pads: masked pad tokens), rows :n."""
    length = n if n <= C else -(-n // C) * C
    xp = torch.nn.functional.pad(x, (0, 0, 0, length - n))
    real = torch.ones(x.shape[:2], dtype=torch.bool) if mask is None else mask
    mp = torch.nn.functional.pad(real, (0, length - n))
    hf_mask = None if mask is None and length == n else mp.long()
    return module(xp, attention_mask=hf_mask).hidden_states[:, :n]


def _inputs(n, dtype, masked):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(B, n, H * D, generator=g, dtype=dtype)
    mask = None
    if masked:
        mask = torch.ones(B, n, dtype=torch.bool)
        mask[1, :5] = False  # left padding
    return x, mask, torch.randn(B, n, H * D, generator=g, dtype=dtype)


def _run_both(module, core, project, n, dtype, masked):
    """HF's module and our core (on HF's own projections, `project(x)` -> q, k, v) on the same
    input, each backward from the same weighted sum; rotations drawn from the same global RNG
    state where unseeded: (out, ref, input grad, HF's input grad, mask, (q, k, v))."""
    x, mask, weight = _inputs(n, dtype, masked)
    x_hf, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    torch.manual_seed(1)
    ref = _hf_run(module, x_hf, mask, n)
    (ref * weight).sum().backward()
    qkv = project(x_ours)
    torch.manual_seed(1)
    out = _merge(core(*qkv, key_padding_mask=mask))
    (out * weight).sum().backward()
    return out, ref, x_ours.grad, x_hf.grad, mask, qkv


def _compare_lsh(dtype, kernel, causal, n, hashes, buckets, masked, before, after, seed):
    torch.manual_seed(0)
    module = (
        reformer()
        .LSHSelfAttention(
            _config(
                is_decoder=causal,
                num_hashes=hashes,
                num_buckets=list(buckets) if isinstance(buckets, tuple) else buckets,
                hash_seed=seed,
                lsh_attn_chunk_length=C,
                lsh_num_chunks_before=before,
                lsh_num_chunks_after=after,
            )
        )
        .to(dtype)
    )
    ours = build_attention(
        "lsh",
        causal=causal,
        device="cpu",
        semantics="hf",
        kernel=kernel,
        chunk_length=C,
        num_chunks_before=before,
        num_chunks_after=after,
        num_hashes=hashes,
        num_buckets=buckets,
        seed=seed,
    )

    def project(x):
        qk = _split(module.query_key(x))
        return qk, qk, _split(module.value(x))

    out, ref, grad, ref_grad, _, (_, _, v) = _run_both(module, ours, project, n, dtype, masked)
    return out, ref, _merge(v), grad, ref_grad


LSH_CASES = [
    (causal, n, hashes, buckets, masked, window, seed)
    for causal, n, hashes, buckets, masked, window, seed in itertools.product(
        (False, True),
        (6, 37, 48),
        (1, 2, 3, 4),
        (4, (2, 4), (2, 2, 2)),
        (False, True),
        ((1, 0), (1, 1)),
        (5, None),
    )
    # a spread of the grid: every value of every axis, each pair of causal and length
    if (hashes + len(str(buckets)) + masked + window[1] + 2 * (seed is None)) % 12 == n % 12
]


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["cpu-fused", "math"])
def test_lsh_equals_hf_in_float64(kernel):
    """Outputs and input gradients (through HF's projections) within 1e-9."""
    assert len(LSH_CASES) >= 20
    for case in LSH_CASES:
        out, ref, _, grad, ref_grad = _compare_lsh(torch.float64, kernel, *case[:4], case[4],
                                                   *case[5], case[6])  # fmt: skip
        torch.testing.assert_close(
            out, ref, atol=1e-9, rtol=1e-9, msg=lambda m, case=case: f"{case}: {m}"
        )
        n = ref.shape[1]
        torch.testing.assert_close(grad[:, :n], ref_grad[:, :n], atol=1e-9, rtol=1e-9,
                                   msg=lambda m, case=case: f"{case}: {m}")  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["cpu-fused", "math"])
def test_lsh_equals_hf_in_float32(kernel):
    """Within 1e-5 of HF's float32 result, queries that see only themselves included: HF's
    rounding of their -1e5 self scores (value times 1 +- 4e-3) is reproduced, not corrected."""
    alone_seen = 0
    for case in LSH_CASES[::6]:
        out, ref, v, grad, ref_grad = _compare_lsh(torch.float32, kernel, *case[:4], case[4],
                                                   *case[5], case[6])  # fmt: skip
        n = ref.shape[1]
        heads = (*out.shape[:2], H, D)  # a query sees only itself in one head, maybe not others
        alone_seen += int(((out - v).view(heads).abs().amax(-1) < 1e-2).sum())
        scale = ref.abs().max().item()
        torch.testing.assert_close(out, ref, atol=1e-5 * scale, rtol=1e-5,
                                   msg=lambda m, case=case: f"{case}: {m}")  # fmt: skip
        grad_scale = ref_grad[:, :n].abs().max().item()
        torch.testing.assert_close(grad[:, :n], ref_grad[:, :n], atol=1e-5 * grad_scale,
                                   rtol=1e-5, msg=lambda m, case=case: f"{case}: {m}")  # fmt: skip
    assert alone_seen > 0  # the cases hold queries that see only themselves


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["cpu-fused", "math"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_lsh_equals_hf_in_16_bits(kernel, dtype):
    """HF's 16-bit self values round far more (bfloat16: -1e5 is -99840, steps of 512, so a
    query that sees only itself gets its value once per copy; float16: -1e3, steps of 0.5):
    reproduced too (before: 75% and 18% off). The materialised path is HF's arithmetic (its
    matmuls may still sum in another order); the fused kernel accumulates in float32, within a few
    steps of the dtype."""
    tol = (2 if kernel == "math" else 8) * torch.finfo(dtype).eps
    for case in LSH_CASES[::3]:
        out, ref, *_ = _compare_lsh(dtype, kernel, *case[:4], case[4], *case[5], case[6])
        error = ((out - ref).abs().max() / ref.abs().max()).item()
        assert error <= tol, (case, error)


def _plan(perm, before, after):
    b, _, _, npad = perm.shape
    real = torch.ones(b, npad, dtype=torch.bool)
    return CircularPlan(chunk=C, before=before, after=after, causal=False, groups=[(0, 1)],
                        perm=perm, key_real=real, scale=1.0, key_eps=None,
                        self_partial=True)  # fmt: skip


WINDOWS = [(1, 0), (1, 1), (2, 2), (3, 0), (0, 3), (4, 1), (5, 5)]  # chunks before, after


@pytest.mark.parametrize("rounds", [1, 2, 3])
def test_windows_and_self_copies_are_hfs_look_adjacent(rounds):
    """Every window (offsets past the whole concatenation included: HF's slices clamp them to
    the query's own chunk) holds the positions HF's `_look_adjacent` gives, and the count of a
    position's own copies in its windows is what those windows hold."""
    g = torch.Generator().manual_seed(rounds)
    npad = 2 * C  # two chunks per round: offsets of two or more chunks wrap
    perm = torch.stack([torch.randperm(npad, generator=g) for _ in range(2 * rounds)])
    perm = perm.view(1, 2, rounds, npad)
    for before, after in WINDOWS:
        plan = _plan(perm, before, after)
        chunks = perm.reshape(1, 2, -1, C)
        hf = reformer().LSHSelfAttention._look_adjacent(None, chunks, before, after)
        assert torch.equal(plan.window_positions(), hf.reshape(2, -1, hf.shape[-1]))
        q_pos = perm.reshape(2, -1, C, 1)
        copies = (plan.window_positions().unsqueeze(2) == q_pos).sum(-1)  # per slot
        slot = undo_perm(perm).reshape(2, -1)  # (rows, R * npad): position p of round r's slot
        expected = torch.gather(copies.reshape(2, -1), 1, slot).view(1, 2, rounds, npad)
        assert torch.equal(plan.self_copies().long(), expected), (before, after)


WRAPPING = [(2, 2), (3, 0), (4, 1)]  # windows of more chunks than a round has (two)


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["auto", "math"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_lsh_equals_hf_when_windows_wrap_around_more_than_once(kernel, dtype):
    """Two chunks per round, windows of up to five chunks: a query's own chunk is in its window
    several times per round (HF scores every copy of itself with the self value), and offsets
    past the whole concatenation are the query's own chunk again."""
    tol = 1e-9 if dtype == torch.float64 else 1e-5
    for causal, hashes, window in itertools.product((False, True), (1, 2), WRAPPING):
        case = (causal, 12, hashes, 4, False, *window, 1)
        out, ref, _, grad, ref_grad = _compare_lsh(dtype, kernel, *case)
        scale, grad_scale = ref.abs().max().item(), ref_grad.abs().max().item()
        torch.testing.assert_close(out, ref, atol=tol * scale, rtol=tol,
                                   msg=lambda m, case=case: f"{case}: {m}")  # fmt: skip
        torch.testing.assert_close(grad, ref_grad, atol=tol * grad_scale, rtol=tol,
                                   msg=lambda m, case=case: f"{case}: {m}")  # fmt: skip


def _compare_local(dtype, kernel, causal, n, masked, before, after):
    torch.manual_seed(0)
    module = (
        reformer()
        .LocalSelfAttention(
            _config(
                is_decoder=causal,
                local_attn_chunk_length=C,
                local_num_chunks_before=before,
                local_num_chunks_after=after,
            )
        )
        .to(dtype)
    )
    ours = build_attention(
        "local",
        causal=causal,
        device="cpu",
        semantics="hf",
        kernel=kernel,
        chunk_length=C,
        num_chunks_before=before,
        num_chunks_after=after,
    )

    def project(x):
        return tuple(_split(p(x)) for p in (module.query, module.key, module.value))

    return _run_both(module, ours, project, n, dtype, masked)[:5]


LOCAL_CASES = [
    *itertools.product((False, True), (5, 37, 48), (False, True), ((1, 0), (0, 1), (1, 1), (2, 2))),
    # two or three chunks: windows hold a chunk twice, or reach past the sequence (HF: the
    # query's own chunk again), causal without padding included
    *itertools.product((False, True), (12, 20), (False, True), ((2, 0), (3, 0), (4, 1))),
]


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["cpu-fused", "math"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_local_equals_hf(kernel, dtype):
    """Windows wrap around the sequence; float64 within 1e-9 everywhere (a padding query that
    sees no real key averages its window, as HF's softmax of equal scores does), float32 within
    1e-5 on real queries (HF's float32 sums, not averages, such a padding query's window)."""
    tol = 1e-7 if dtype == torch.float64 else 1e-5  # HF's float64 padding rows: ~2e-9 off
    for causal, n, masked, (before, after) in LOCAL_CASES:
        case = (causal, n, masked, before, after)
        windows = SimpleNamespace(
            semantics="hf", chunk_length=C, num_chunks_before=before, num_chunks_after=after
        )
        if kernel == "cpu-fused" and consecutive_reason(windows, n):  # HF clamps: math only
            with pytest.raises(UnavailableError, match="materialised only"):
                _compare_local(dtype, kernel, *case)
            continue
        out, ref, grad, ref_grad, mask = _compare_local(dtype, kernel, *case)
        rows = slice(None)
        if dtype == torch.float32 and mask is not None:
            rows = mask[:, :, None].expand_as(out)
        torch.testing.assert_close(out[rows], ref[rows], atol=tol, rtol=tol,
                                   msg=lambda m, case=case: f"{case}: {m}")  # fmt: skip
        if dtype == torch.float64:
            torch.testing.assert_close(grad, ref_grad[:, :n], atol=tol, rtol=tol,
                                       msg=lambda m, case=case: f"{case}: {m}")  # fmt: skip


def test_hf_causal_lsh_is_not_exactly_causal_while_exact_is():
    """HF's causal LSH masks by position, but later tokens' buckets move earlier queries'
    windows; the capability says so, and the exact semantics stay exactly causal."""
    from attention_zoo import get_backend

    spec = get_backend("lsh")
    assert not spec.caps_for(semantics="hf").exactly_causal
    assert (
        spec.caps_for().exactly_causal
        and get_backend("local").caps_for(semantics="hf").exactly_causal
    )
    g = torch.Generator().manual_seed(0)
    qk, v = (torch.randn(2, 2, 128, 16, generator=g, dtype=torch.float64) for _ in range(2))
    leak = {}
    for semantics in ("exact", "hf"):
        attn = build_attention("lsh", causal=True, device="cpu", chunk_length=C, num_hashes=2,
                               num_buckets=4, seed=3, semantics=semantics)  # fmt: skip
        base = attn(qk, qk, v)
        qk2, v2 = qk.clone(), v.clone()
        qk2[:, :, 64:] = torch.randn(qk2[:, :, 64:].shape, generator=g, dtype=qk.dtype)
        v2[:, :, 64:] *= 3
        leak[semantics] = (attn(qk2, qk2, v2) - base)[:, :, :64].abs().max().item()
    assert leak["exact"] < 1e-12 and leak["hf"] > 1e-2, leak


def test_hf_local_keeps_following_chunks_when_causal_and_stays_causal():
    """HF keeps num_chunks_after when causal: the last chunk's wrapped 'next' chunk is the first,
    all in the past, so it is attended; nothing in the future ever is."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 32, 8, generator=g, dtype=torch.float64) for _ in range(3))
    kw = dict(causal=True, device="cpu", chunk_length=8, num_chunks_before=0, num_chunks_after=1)
    hf = build_attention("local", semantics="hf", **kw)
    exact = build_attention("local", **kw)
    torch.testing.assert_close(hf(q, k, v)[:, :, :24], exact(q, k, v)[:, :, :24])
    assert not torch.allclose(hf(q, k, v)[:, :, 24:], exact(q, k, v)[:, :, 24:])
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 20:], v2[:, :, 20:] = 5.0, 5.0
    torch.testing.assert_close(hf(q, k2, v2)[:, :, :20], hf(q, k, v)[:, :, :20], rtol=0, atol=0)


def test_num_buckets_none_never_depends_on_padding():
    """With num_buckets=None the count comes from max_length (HF: max_position_embeddings) or
    the length as given, never from the length rounded up to whole chunks; a padded batch
    then gives its real tokens the outputs of the unpadded one."""
    attn = build_attention("lsh", device="cpu", chunk_length=C, seed=0, num_hashes=2)
    assert attn.buckets_for(33) == auto_buckets(33, C) == 8  # 40 would also give 8; 33 is used
    assert attn.buckets_for(48) == 8 and attn.buckets_for(64) == 16
    sized = build_attention("lsh", device="cpu", chunk_length=C, seed=0, max_length=4096)
    assert sized.buckets_for(40) == sized.buckets_for(4000) == auto_buckets(4096, C, 4096)
    assert auto_buckets(2048, 64, 65536) == 64 and auto_buckets(2048, 64) == 64
    assert auto_buckets(16384, 64, 16384) == (16, 32)
    g = torch.Generator().manual_seed(0)
    qk, v = (torch.randn(2, 2, 30, 8, generator=g, dtype=torch.float64) for _ in range(2))
    extra = torch.randn(2, 2, 9, 8, generator=g, dtype=torch.float64)
    mask = torch.ones(2, 39, dtype=torch.bool)
    mask[:, 30:] = False
    for causal in (False, True):
        lsh = build_attention("lsh", causal=causal, device="cpu", chunk_length=C, seed=0,
                              num_hashes=2, max_length=64)  # fmt: skip
        padded = lsh(torch.cat([qk, extra], 2), torch.cat([qk, extra], 2),
                     torch.cat([v, extra], 2), key_padding_mask=mask)  # fmt: skip
        torch.testing.assert_close(padded[:, :, :30], lsh(qk, qk, v), atol=1e-12, rtol=1e-12)
    with pytest.raises(
        OptionError, match="with a key_padding_mask give num_buckets, or max_length"
    ):
        attn(qk, qk, v, key_padding_mask=torch.ones(2, 30, dtype=torch.bool))


@pytest.mark.parametrize(
    "backend,options,message",
    [
        ("lsh", {"semantics": "trax"}, "semantics 'trax' is not one of: exact, hf"),
        ("local", {"semantics": None}, "semantics None is not one of: exact, hf"),
        ("lsh", {"max_length": 0}, "max_length must be an int >= 1"),
    ],
)
def test_bad_semantics_options_say_what_would_work(backend, options, message):
    with pytest.raises(OptionError) as err:
        build_attention(backend, device="cpu", **options)
    assert message in str(err.value)
