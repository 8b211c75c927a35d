"""`lsh`: multi-round LSH attention equals shared-QK attention under the mask its own buckets and
chunks define, combined by log-sum-exp; exactly causal (HF semantics: test_hf_semantics.py)."""

from __future__ import annotations

import itertools

import pytest
import torch

from attention_zoo import OptionError, SelfAttention, build_attention
from attention_zoo.attention.kernels.chunked import padded_length
from attention_zoo.attention.kernels.dense import dense_attention, unit_keys
from attention_zoo.attention.kernels.rounds.lsh_hashing import auto_buckets
from attention_zoo.attention.lsh import LSHConfig

from .contract import with_grads

C = 8  # chunk length used by most tests


def lsh_allowed(buckets, chunk, before, after, *, causal):
    """(b, h, r, n, n) bool: the pairs one LSH round lets attend, from its buckets (b, h, r, n).

    Positions sort by (bucket, position); s is a position's sorted index. Same bucket always;
    non-causal: key chunk of s within [-before, +after] of the query's; causal: at most
    chunk * before sorted predecessors.
    """
    n = buckets.shape[-1]
    npad = padded_length(n, chunk)
    s = (buckets * npad + torch.arange(n)).argsort(-1).argsort(-1)
    si, sj = s[..., :, None], s[..., None, :]
    same = buckets[..., :, None] == buckets[..., None, :]
    ci, cj = si // chunk, sj // chunk
    if not causal:
        return same & (cj >= ci - before) & (cj <= ci + after)
    return same & (sj <= si) & (sj >= si - before * chunk)


def dense_lsh(qk, v, buckets, chunk, before, after, *, causal):
    """Per-round dense shared-QK attention under `lsh_allowed`, rounds combined by lse weights."""
    allowed = lsh_allowed(buckets, chunk, before, after, causal=causal)
    out, lse = dense_attention(
        qk[:, :, None],
        unit_keys(qk)[:, :, None],
        v[:, :, None],
        allowed,
        scale=1.0,
        penalise_self=True,
        return_lse=True,
    )
    return (out * torch.softmax(lse, dim=2).unsqueeze(-1)).sum(2)


def _qkv(b=2, h=3, n=37, d=16, *, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, h, n, d, generator=g, dtype=dtype), torch.randn(
        b, h, n, d, generator=g, dtype=dtype
    )


def _lsh(causal=False, **options):
    opts = dict(chunk_length=C, num_hashes=2, num_buckets=4, seed=3)
    opts.update(options)
    return build_attention("lsh", causal=causal, device="cpu", **opts)


@pytest.mark.parametrize("kernel", ["cpu-fused", "math"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("n", [32, 37], ids=["multiple-of-chunk", "not-multiple"])
@pytest.mark.parametrize("hashes", [1, 3])
def test_lsh_equals_dense_shared_qk_under_its_bucket_mask(kernel, causal, n, hashes):
    qk, v = _qkv(n=n)
    attn = _lsh(causal, num_hashes=hashes, num_chunks_after=1, kernel=kernel)
    buckets = attn.hash(qk)
    assert buckets.shape == (2, 3, hashes, n)
    out, grads = with_grads(lambda x, v: attn(x, x, v), (qk, v))
    after = 0 if causal else 1
    ref, ref_grads = with_grads(
        lambda x, v: dense_lsh(x, v, buckets, C, 1, after, causal=causal), (qk, v)
    )
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_key_padding_goes_to_an_extra_bucket(causal):
    qk, v = _qkv(n=37)
    mask = torch.ones(2, 37, dtype=torch.bool)
    mask[0, 25:] = False
    mask[1, 3:9] = False
    attn = _lsh(causal)
    buckets = attn.hash(qk, key_padding_mask=mask)
    assert (buckets[0, :, :, 25:] == 4).all() and (
        buckets[mask[:, None, None, :].expand_as(buckets)] < 4
    ).all()
    out = attn(qk, qk, v, key_padding_mask=mask)
    ref = dense_lsh(qk, v, buckets, C, 1, 0, causal=causal)
    rows = mask[:, None, :, None].expand_as(out)  # padding queries have no defined output
    torch.testing.assert_close(out[rows], ref[rows], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernel", ["cpu-fused", "math"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_one_bucket_and_a_window_covering_everything_equals_shared_qk(kernel, causal):
    qk, v = _qkv(n=37)
    lsh = build_attention(
        "lsh",
        causal=causal,
        device="cpu",
        num_buckets=1,
        chunk_length=64,
        num_hashes=2,
        seed=0,
        kernel=kernel,
    )
    ref = build_attention("shared-qk", causal=causal, device="cpu")
    torch.testing.assert_close(lsh(qk, qk, v), ref(qk, qk, v), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_error_against_shared_qk_falls_as_hashes_grow(causal):
    """Averaged over seeds, more hash rounds -> closer to shared-QK attention (1 -> 2 -> 4 -> 8)."""
    qk, v = _qkv(b=4, h=2, n=64)
    target = build_attention("shared-qk", causal=causal, device="cpu")(qk, qk, v)
    means = []
    for hashes in (1, 2, 4, 8):
        errors = [
            (_lsh(causal, num_hashes=hashes, num_buckets=8, seed=seed)(qk, qk, v) - target)
            .abs()
            .mean()
            for seed in range(6)
        ]
        means.append(torch.stack(errors).mean().item())
    assert all(a > b for a, b in itertools.pairwise(means)), (
        f"mean |lsh - shared-qk| by hashes 1,2,4,8: {means}"
    )
    assert means[-1] < 0.6 * means[0]


def _future_changed(attn, qk, v, i):
    """Outputs of positions <= i after q/k/v at positions > i were replaced."""
    qk2, v2 = qk.clone(), v.clone()
    g = torch.Generator().manual_seed(i)
    qk2[:, :, i + 1 :] = torch.randn(qk2[:, :, i + 1 :].shape, generator=g, dtype=qk.dtype)
    v2[:, :, i + 1 :] = torch.randn(v2[:, :, i + 1 :].shape, generator=g, dtype=qk.dtype) * 3
    return attn(qk2, qk2, v2)[:, :, : i + 1]


def test_default_causal_lsh_is_exact():
    qk, v = _qkv(b=2, h=2, n=128, dtype=torch.float64)
    exact = _lsh(True, num_buckets=4)
    base = exact(qk, qk, v)
    for i in (20, 63, 96):
        # exact up to float64 rounding: a past query's keys may fall into other chunks of the window
        torch.testing.assert_close(
            _future_changed(exact, qk, v, i), base[:, :, : i + 1], atol=1e-12, rtol=0
        )


def test_seed_reproduces_rotations_and_none_replays_the_global_rng():
    qk, v = _qkv()
    torch.testing.assert_close(_lsh(seed=7)(qk, qk, v), _lsh(seed=7)(qk, qk, v), atol=0, rtol=0)
    assert not torch.equal(_lsh(seed=7).hash(qk), _lsh(seed=8).hash(qk))
    unseeded = _lsh(seed=None)
    state = torch.get_rng_state()
    first = unseeded(qk, qk, v)
    torch.set_rng_state(state)  # what a reversible layer does before recomputing
    torch.testing.assert_close(unseeded(qk, qk, v), first, atol=0, rtol=0)
    assert not torch.equal(unseeded(qk, qk, v), first)  # the RNG moved on: fresh rotations


@pytest.mark.slow  # every kernel x rounds-per-pass x key combination: ~5 s
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_rounds_per_pass_and_kernels_do_not_change_results(causal):
    """Fused vs materialised kernels, all rounds at once vs a few per pass, shared or separate
    keys: same outputs and gradients within 1e-5 (float32)."""
    qk, v = _qkv(n=45)
    k = torch.randn_like(qk)
    results = {}
    for kernel in ("math", "cpu-fused"):
        for per_pass in (None, 1, 2):
            attn = _lsh(causal, num_hashes=3, kernel=kernel, rounds_per_pass=per_pass)
            results[kernel, per_pass, "shared"] = with_grads(
                lambda x, v, attn=attn: attn(x, x, v), (qk, v)
            )
            results[kernel, per_pass, "separate"] = with_grads(attn, (qk, k, v))
    for case, (out, grads) in results.items():
        ref_out, ref_grads = results["math", None, case[2]]
        torch.testing.assert_close(
            out, ref_out, atol=1e-5, rtol=1e-5, msg=lambda m, case=case: f"{case}: {m}"
        )
        for got, want in zip(grads, ref_grads):
            torch.testing.assert_close(
                got, want, atol=1e-5, rtol=1e-5, msg=lambda m, case=case: f"{case}: {m}"
            )


def test_padded_garbage_after_the_sequence_changes_nothing():
    qk, v = _qkv(n=30, dtype=torch.float64)
    extra = _qkv(n=9, seed=1, dtype=torch.float64)
    qk2, v2 = torch.cat([qk, extra[0]], 2), torch.cat([v, extra[1]], 2)
    mask = torch.ones(2, 39, dtype=torch.bool)
    mask[:, 30:] = False
    for causal in (False, True):
        attn = _lsh(causal)
        torch.testing.assert_close(
            attn(qk2, qk2, v2, key_padding_mask=mask)[:, :, :30],
            attn(qk, qk, v),
            atol=1e-12,
            rtol=1e-12,
        )


def test_batch_rows_never_see_each_other():
    qk, v = _qkv(b=3, n=37)
    attn = _lsh(False, num_chunks_after=1)
    base = attn(qk, qk, v)
    qk2, v2 = qk.clone(), v.clone()
    qk2[0], v2[2] = torch.randn_like(qk2[0]) * 5, torch.randn_like(v2[2]) * 5
    torch.testing.assert_close(attn(qk2, qk2, v2)[1], base[1], atol=0, rtol=0)


def test_buckets_factorised_and_automatic():
    qk, _ = _qkv(n=40)
    buckets = _lsh(num_buckets=(4, 6), num_hashes=3).hash(qk)
    assert buckets.shape == (2, 3, 3, 40) and buckets.min() >= 0 and buckets.max() < 24
    assert len(buckets.unique()) > 6  # both factors are used
    three = _lsh(num_buckets=(2, 4, 2), num_hashes=3).hash(qk)
    assert three.max() < 16 and len(three.unique()) > 8  # HF takes any number of factors
    assert auto_buckets(16384, 64) == (16, 32)  # 512 > 2 * max(16, 64): factorised, as HF does
    assert auto_buckets(4096, 64) == 128
    assert auto_buckets(40, 8) == 8
    assert _lsh(num_buckets=None).buckets_for(37) == 8  # from the length as given
    assert LSHConfig(num_buckets=[4, 8]).num_buckets == (4, 8)
    assert LSHConfig(num_buckets=[4]).num_buckets == (4,)


def test_runs_on_meta_and_in_the_block():
    q = torch.empty(1, 2, 4099, 64, device="meta")
    out = build_attention("lsh", causal=True, device="meta", num_hashes=4, seed=1)(q, q, q)
    assert out.shape == q.shape and out.device.type == "meta"
    block = SelfAttention(32, 4, "lsh", causal=True, num_hashes=2, chunk_length=8, seed=0)
    assert block.in_proj.out_features == 2 * 32  # one shared query/key projection
    assert block(torch.randn(2, 21, 32)).shape == (2, 21, 32)


@pytest.mark.parametrize(
    "options,message",
    [
        ({"num_buckets": 3}, "positive even int"),
        ({"num_buckets": 0}, "positive even int"),
        (
            {"num_buckets": (4, 3)},
            "list of positive even factors (a, b, ...) giving a*b*... buckets; got the factorised "
            "value (4, 3)",
        ),
        ({"num_buckets": ()}, "got the factorised value ()"),
        ({"num_buckets": (True, 4)}, "got the factorised value (True, 4)"),
        ({"num_buckets": "64"}, "got str '64'"),
        ({"num_hashes": 0}, "num_hashes must be an int >= 1"),
        ({"seed": -1}, "seed must be an int >= 0"),
        ({"rounds_per_pass": 0}, "rounds_per_pass must be an int >= 1"),
        ({"chunk_length": 0}, "chunk_length must be an int >= 1"),
        ({"dropout": 1.0}, "dropout must be a float in [0, 1)"),
        ({"kernel": "fast"}, "kernel 'fast' is not one of: auto, cpu-fused, math"),
    ],
)
def test_bad_options_say_what_would_work(options, message):
    with pytest.raises(OptionError) as err:
        build_attention("lsh", device="cpu", **options)
    assert message in str(err.value)


@pytest.mark.parametrize("before", [1, 2])
def test_exact_causal_forward_in_quarter_chunk_blocks_matches_the_math_path(monkeypatch, before):
    """Exact causal windows slide with the query, so the fused forward runs 8-query blocks for
    chunk 32 (a smaller mask); outputs and gradients still equal the chunk-blocked math path."""
    from attention_zoo.attention.kernels.rounds.lsh_plan import LSHPlan

    blocks = []
    regrid = LSHPlan.regrid
    monkeypatch.setattr(
        LSHPlan, "regrid", lambda plan, block: blocks.append(block) or regrid(plan, block)
    )
    qk, v = _qkv(n=201)  # two buckets of ~100: look-backs of 32 and 64 positions both bind
    results = [
        with_grads(
            lambda x, v, kernel=kernel: _lsh(
                True,
                chunk_length=32,
                num_chunks_before=before,
                num_hashes=3,
                num_buckets=2,
                kernel=kernel,
            )(x, x, v),
            (qk, v),
        )
        for kernel in ("math", "cpu-fused")
    ]
    assert blocks == [8]
    (ref, ref_grads), (out, grads) = results
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
