"""Conformance suite: every registered backend runs it, a newly registered one included."""

from __future__ import annotations

import pytest
import torch
from einops import rearrange
from torch.nn import functional as F

from attention_zoo import RunTarget, SelfAttention
from attention_zoo.attention.base import AttentionCore, BlockWeights
from attention_zoo.attention.inputs import expand_kv
from attention_zoo.attention.kernels.dense import dense_attention
from attention_zoo.errors import UnavailableError

from .contract import (
    build,
    gappy_padding,
    make_inputs,
    make_qkv,
    projected_in_bfloat16,
    reference,
    small_options,
    variants,
    with_grads,
)

SPECS = variants()  # every backend with its defaults and with each option set it declares
IDS = [s.id for s in SPECS]


def _modes(spec) -> list[bool]:
    return [c for c, ok in ((False, spec.caps.non_causal), (True, spec.caps.causal)) if ok]


def _skip_unless_runs(
    spec, *, device: str = "cpu", dtype: str = "float32", causal: bool = False
) -> None:
    if reason := spec.unsupported(RunTarget(device=device, dtype=dtype, causal=causal)):
        pytest.skip(reason)


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_shape_dtype_and_finite(spec, dtype):
    dname = str(dtype).removeprefix("torch.")
    for causal in _modes(spec):
        _skip_unless_runs(spec, dtype=dname, causal=causal)
        x = make_inputs(spec, dtype=dtype)
        out = build(spec, causal=causal)(x.q, x.k, x.v, **x.extras)
        assert out.shape == (*x.q.shape[:3], x.v.shape[-1]) and out.dtype == dtype
        assert torch.isfinite(out).all()


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_gradients_reach_every_parameter(spec, causal):
    _skip_unless_runs(spec, causal=causal)
    block = SelfAttention(32, 4, spec.name, causal=causal, **small_options(spec))
    x = torch.randn(2, 37, 32, requires_grad=True)
    block(x).square().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    for name, p in block.named_parameters():
        assert p.grad is not None, f"no gradient reached {name}"
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, (
            f"zero/non-finite grad on {name}"
        )


CAUSAL = [s for s in SPECS if s.caps.causal and s.caps.exactly_causal]


# what each causal backend's test changes after a position: q, k, v, and its extras if it has any
CHANGES = [
    (s, changed)
    for s in CAUSAL
    for changed in ("q", "k", "v", "extras")
    if changed != "extras" or s.spec.layout(**s.options).extras
]


@pytest.mark.parametrize(("spec", "changed"), CHANGES, ids=[f"{s.id}-{c}" for s, c in CHANGES])
def test_causal_backends_are_exactly_causal(spec, changed):
    _skip_unless_runs(spec, causal=True)
    if not spec.caps.deterministic and "seed" not in spec.defaults():
        pytest.skip(f"{spec.name!r} is random and takes no seed: causality cannot be isolated")
    attn = build(spec, causal=True)
    n = 37
    x = make_inputs(spec, b=2, h=2, n=n, dtype=torch.float64)
    base = attn(x.q, x.k, x.v, **x.extras)
    for i in (0, 5, 17, 30):
        tensors = {"q": x.q.clone(), "k": x.k.clone(), "v": x.v.clone()}
        extras = {name: t.clone() for name, t in x.extras.items()}
        if spec.caps.shared_qk and changed in "qk":
            tensors["q"][:, :, i + 1 :] = torch.randn_like(tensors["q"][:, :, i + 1 :])
            tensors["k"] = tensors["q"]
        elif changed == "extras":  # a later token's values, still in each extra's range
            for name, t in extras.items():
                t[:, :, i + 1 :] = x.extras[name][:, :, i + 1 :].flip(2)
        else:
            t = tensors[changed]
            t[:, :, i + 1 :] = torch.randn_like(t[:, :, i + 1 :]) * 3
        out = attn(tensors["q"], tensors["k"], tensors["v"], **extras)
        torch.testing.assert_close(
            out[:, :, : i + 1],
            base[:, :, : i + 1],
            atol=1e-12,
            rtol=0,
            msg=lambda m, i=i: (
                f"{spec.name}: changing {changed} after {i} changed output <= {i}: {m}"
            ),
        )


EXACT = [s for s in SPECS if s.caps.exact]


@pytest.mark.parametrize("spec", EXACT, ids=[s.id for s in EXACT])
@pytest.mark.parametrize("padded", [False, True], ids=["no-pad", "key-padding"])
def test_exact_backends_agree_with_reference(spec, padded):
    for causal in _modes(spec):
        _skip_unless_runs(spec, causal=causal)
        q, k, v = make_qkv(spec, n=45)
        mask = None
        if padded:
            mask = torch.ones(2, 45, dtype=torch.bool)
            mask[0, 30:] = False
            mask[1, :3] = False
        out = build(spec, causal=causal)(q, k, v, key_padding_mask=mask)
        ref = reference(spec, causal=causal)(q, k, v, key_padding_mask=mask)
        rows = slice(
            3, None
        )  # a causal query whose every visible key is padding has no defined output
        torch.testing.assert_close(out[:, :, rows], ref[:, :, rows], atol=1e-5, rtol=1e-5)


RECURRENT = [s for s in SPECS if s.caps.recurrent]


@pytest.mark.parametrize("spec", RECURRENT, ids=[s.id for s in RECURRENT])
@pytest.mark.parametrize("padded", [False, True], ids=["no-pad", "key-padding"])
def test_recurrences_equal_their_token_by_token_form(spec, padded):
    """A recurrent backend equals its own recurrence run token by token (not full attention), in
    float64, outputs and the gradients of every input, extras included, key padding included."""
    _skip_unless_runs(spec, dtype="float64", causal=True)
    attn = build(spec, causal=True)
    x = make_inputs(spec, n=45, dtype=torch.float64)
    mask = None
    if padded:
        mask = torch.ones(2, 45, dtype=torch.bool)
        mask[0, 30:] = False
        mask[1, :3] = False
    names = list(x.extras)

    def run(fn):
        return lambda q, k, v, *e: fn(q, k, v, mask, **dict(zip(names, e)))

    leaves = [x.q, x.k, x.v, *x.extras.values()]
    (out, grads), (ref, ref_grads) = (
        with_grads(run(attn), leaves),
        with_grads(run(attn.reference_output), leaves),
    )
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-10)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


PATTERNED = [s for s in SPECS if s.caps.fixed_pattern]


@pytest.mark.parametrize("spec", PATTERNED, ids=[s.id for s in PATTERNED])
@pytest.mark.parametrize("padded", [False, True], ids=["no-pad", "key-padding"])
def test_fixed_patterns_equal_a_dense_masked_softmax(spec, padded):
    """A backend with a fixed pattern equals softmax under `pattern(n)` (and the key padding) in
    float64, outputs and gradients, on every query that sees a key; a causal pattern never
    reaches ahead."""
    for causal in _modes(spec):
        _skip_unless_runs(spec, dtype="float64", causal=causal)
        q, k, v = make_qkv(spec, n=45, dtype=torch.float64)
        attn = build(spec, causal=causal)
        allowed = attn.pattern(45)
        assert allowed is not None, f"{spec.id} declares fixed_pattern but pattern(n) is None"
        assert allowed.shape == (45, 45) and allowed.dtype == torch.bool
        if causal:
            assert not allowed.triu(1).any(), f"{spec.id}: causal pattern sees later keys"
        allowed = allowed[None, None]
        mask = None
        if padded:
            mask = torch.ones(2, 45, dtype=torch.bool)
            mask[0, 30:] = False
            mask[1, :3] = False
            allowed = allowed & mask[:, None, None, :]
        rows = allowed.any(-1, keepdim=True)  # other rows have no defined output: zeroed

        def ours(q, k, v, attn=attn, mask=mask, rows=rows):
            return attn(q, q if spec.caps.shared_qk else k, v, key_padding_mask=mask) * rows

        def dense(q, k, v, allowed=allowed, rows=rows):
            k = q if spec.caps.shared_qk else expand_kv(q, k)
            return dense_attention(q, k, expand_kv(q, v), allowed, scale=0.25) * rows

        (out, grads), (ref, ref_grads) = with_grads(ours, [q, k, v]), with_grads(dense, [q, k, v])
        torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-10)
        for got, want in zip(grads, ref_grads):
            torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


@pytest.mark.slow
@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_forward_runs_on_meta_device(spec):
    for causal in _modes(spec):
        _skip_unless_runs(spec, device="meta", causal=causal)
        x = make_inputs(spec, n=4099, d=64, device="meta")
        out = build(spec, causal=causal, device="meta")(x.q, x.k, x.v, **x.extras)
        assert out.device.type == "meta" and out.shape == (*x.q.shape[:3], x.v.shape[-1])


@pytest.mark.slow  # compiling takes 3-12 s per backend
@pytest.mark.long
@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_compiles_to_one_graph_with_eager_results(spec):
    """torch.compile(fullgraph=True) traces every backend's forward and backward as one graph (no
    graph break, so no data-dependent shape or untraceable call in the attention path), with the
    eager outputs and gradients. aot_eager: traced and functionalised, no C++ toolchain needed.
    A fixed-pattern backend keeps its seed (its pattern is a function of its options, so it must
    compile); another seeded one runs unseeded (its seed may build a torch.Generator per call,
    which Dynamo cannot create inside a graph), from the same global RNG state on both sides."""
    for causal in _modes(spec):
        _skip_unless_runs(spec, causal=causal)
        x = make_inputs(spec, n=37)
        unseeded = "seed" in spec.defaults() and not spec.caps.fixed_pattern
        options = {"seed": None} if unseeded else {}
        attn = build(spec, causal=causal, **options)
        shared = spec.caps.shared_qk
        inputs = (x.q, x.v) if shared else (x.q, x.k, x.v)

        def call(*args, attn=attn, shared=shared, extras=x.extras):
            if shared:
                return attn(args[0], args[0], args[1], **extras)
            return attn(*args, **extras)

        def seeded(fn):
            return lambda *args: (torch.manual_seed(0), fn(*args))[1]

        torch._dynamo.reset()
        compiled = torch.compile(call, backend="aot_eager", fullgraph=True)
        out, grads = with_grads(seeded(compiled), inputs)
        ref, ref_grads = with_grads(seeded(call), inputs)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        for got, want in zip(grads, ref_grads):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_strided_inputs_give_the_dense_results(spec):
    """q, k, v unpacked from one (b, h, n, d, 3) tensor (last-dim stride 3): same outputs and
    gradients as dense copies -- a raw kernel must never read strided rows as dense ones."""
    for causal in _modes(spec):
        _skip_unless_runs(spec, causal=causal)
        g = torch.Generator().manual_seed(0)
        packed = torch.randn(1, 3, 64, 16, 3, generator=g)  # batch 1: flat views stay views
        weight = torch.randn(1, 3, 64, 16, generator=g)
        attn = build(spec, causal=causal)
        x = make_inputs(spec, b=1, h=3, n=64)  # the extras (dense) and the shapes k, v take
        kv = x.k.shape[1]

        def run(dense: bool, attn=attn, packed=packed, weight=weight, x=x, kv=kv):
            leaf = packed.clone().requires_grad_()
            q, k, v = leaf.unbind(-1)
            k, v = k[:, :kv], v[:, :kv]  # shared KV heads: the first ones (still strided)
            if dense:
                q, k, v = (t.contiguous() for t in (q, k, v))
            out = attn(q, q if spec.caps.shared_qk else k, v, **x.extras)
            (out * weight).sum().backward()
            return out.detach(), leaf.grad

        (out, grad), (ref, ref_grad) = run(dense=False), run(dense=True)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(grad, ref_grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_second_order_gradients_are_right_or_refused(spec):
    """create_graph=True: second derivatives equal finite differences of the first, or the call
    fails loudly (a hand-written backward refuses; torch has no double backward for its fused
    SDPA); never a silently wrong or missing second-order term. Fast mode compares them along
    random directions, which such a term changes too, in a few passes instead of one per entry."""
    for causal in _modes(spec):
        _skip_unless_runs(spec, dtype="float64", causal=causal)
        attn = build(spec, causal=causal).double()
        x = make_inputs(spec, b=1, h=2, n=12, d=4, dtype=torch.float64, requires_grad=True)
        shared, names = x.k is x.q, list(x.extras)

        def f(q, *rest, attn=attn, shared=shared, names=names):  # x.leaves(): q is k once
            torch.manual_seed(0)  # random features and hashes: the same draw every call
            k, v, *extras = (q, *rest) if shared else rest
            return attn(q, k, v, **dict(zip(names, extras)))

        try:
            torch.autograd.gradgradcheck(f, x.leaves(), atol=1e-6, rtol=1e-5, fast_mode=True)
        except UnavailableError as e:
            assert "create_graph=True" in str(e)
        except RuntimeError as e:
            if "not implemented" not in str(e):
                raise


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_padding_keys_never_change_real_outputs(spec):
    """Keys masked as padding must be invisible: appending padded garbage changes nothing (in each
    mode whose pattern at length 30 is the first 30 positions' at 39)."""
    if not (spec.caps.exact or spec.caps.fixed_pattern or spec.caps.recurrent):
        pytest.skip(
            "approximate mechanisms test their own padding rules (bucketing depends on length)"
        )
    checked = []
    for causal in _modes(spec):
        _skip_unless_runs(spec, causal=causal)
        attn = build(spec, causal=causal)
        if spec.caps.fixed_pattern and not attn.pattern(39)[:30, :30].equal(attn.pattern(30)):
            continue  # e.g. bigbird's bidirectional random blocks depend on the length
        checked.append(causal)
        x = make_inputs(spec, n=30, dtype=torch.float64)
        more = make_inputs(spec, n=9, dtype=torch.float64)
        q2, k2, v2 = (
            torch.cat([a, b], dim=2) for a, b in zip((x.q, x.k, x.v), (more.q, more.k, more.v))
        )
        if spec.caps.shared_qk:
            k2 = q2
        extras2 = {name: torch.cat([t, more.extras[name]], dim=2) for name, t in x.extras.items()}
        mask = torch.ones(2, 39, dtype=torch.bool)
        mask[:, 30:] = False
        out = attn(q2, k2, v2, key_padding_mask=mask, **extras2)[:, :, :30]
        want = attn(x.q, x.k, x.v, **x.extras)
        torch.testing.assert_close(out, want, atol=1e-10, rtol=1e-10)
    if not checked:
        pytest.skip(f"{spec.id}'s pattern at length 30 differs from its first 30 at 39")


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_a_block_under_autocast_computes_as_in_its_dtype(spec):
    """Under autocast the core computes in autocast's dtype with autocast off: the block's output
    is the one its bfloat16 projections give, and a backward run under autocast too (the custom
    Functions' own backwards) reaches every parameter."""
    for causal in _modes(spec):
        _skip_unless_runs(spec, dtype="bfloat16", causal=causal)
        torch.manual_seed(0)
        block = SelfAttention(32, 4, spec.name, causal=causal, **small_options(spec))
        half = projected_in_bfloat16(block)
        x = torch.randn(2, 37, 32)
        mask = torch.ones(2, 37, dtype=torch.bool)
        mask[1, :3] = False
        x16 = half.project(x.bfloat16())  # projected, then the core (a folded block fuses the two)
        out = half.core(x16.q, x16.k, x16.v, mask, **x16.extras)
        want = half.out_proj(rearrange(out, "b h n d -> b n (h d)"))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = block(x, mask)
            got.float().square().sum().backward()
        assert got.dtype == torch.bfloat16 and torch.equal(got, want)
        for name, p in block.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), name
            assert p.grad.abs().sum() > 0, name


@pytest.mark.gpu
@pytest.mark.parametrize("spec", EXACT, ids=[s.id for s in EXACT])
@pytest.mark.parametrize("padded", [False, True], ids=["no-pad", "key-padding"])
def test_exact_backends_agree_on_cuda(spec, padded):
    """On CUDA too, at a length no multiple of 8 (a kernel's alignment) with key padding."""
    for causal in _modes(spec):
        _skip_unless_runs(spec, device="cuda", causal=causal)
        q, k, v = make_qkv(spec, n=45 if padded else 200, d=64, device="cuda")
        mask = gappy_padding(45).cuda() if padded else None
        out = build(spec, causal=causal, device="cuda")(q, k, v, key_padding_mask=mask)
        ref = reference(spec, causal=causal)(q, k, v, key_padding_mask=mask)
        torch.testing.assert_close(out[:, :, 3:], ref[:, :, 3:], atol=2e-5, rtol=2e-5)


# backends whose core folds the block's linear maps into its own products (attend_block)
FOLDING = [
    s
    for s in SPECS
    if not s.caps.shared_qk
    and getattr(s.spec.cls, "attend_block", AttentionCore.attend_block)
    is not AttentionCore.attend_block
]


def _folded_block(spec) -> SelfAttention:
    """A float64 block in eval mode whose core folds the maps at the tests' sizes (else skip:
    comparing the projecting path with itself would prove nothing)."""
    _skip_unless_runs(spec, dtype="float64")
    block = SelfAttention(32, 4, spec.name, **small_options(spec)).double().eval()
    probe = torch.zeros(2, 37, 32, dtype=torch.float64)
    w = block.in_proj.weight.split(32)
    if block.core.attend_block(probe, BlockWeights(*w, block.out_proj.weight, 4), None) is None:
        pytest.skip(f"{spec.id} declines to fold at 4 heads x 8, hidden 32, length 37")
    return block


@pytest.mark.parametrize("spec", FOLDING, ids=[s.id for s in FOLDING])
@pytest.mark.parametrize("padded", [False, True], ids=["no-pad", "key-padding"])
def test_folded_blocks_equal_projecting_then_attending(spec, padded):
    """A core that folds the block's linear maps into its own products computes the block's
    function: output and every gradient equal projecting q, k, v and calling the core (float64)."""
    block = _folded_block(spec)
    b, n = 2, 37
    mask = None
    if padded:  # padding at the end, inside, and a row of padding only
        b = 3
        mask = torch.ones(b, n, dtype=torch.bool)
        mask[1, 29:] = False
        mask[1, 3:9] = False
        mask[2] = False

    def unfolded(x):
        q, k, v = (
            rearrange(F.linear(x, w), "b n (h d) -> b h n d", h=4)
            for w in block.in_proj.weight.split(32)
        )
        return block.out_proj(rearrange(block.core(q, k, v, mask), "b h n d -> b n (h d)"))

    x = torch.randn(b, n, 32, dtype=torch.float64)
    runs = []
    for fn in (lambda t: block(t, key_padding_mask=mask), unfolded):
        block.zero_grad()
        out, (grad,) = with_grads(fn, [x])
        runs.append((out, grad, [p.grad.clone() for p in block.parameters()]))
    (out, grad, params), (ref, ref_grad, ref_params) = runs
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(grad, ref_grad, atol=1e-11, rtol=1e-11)
    for got, want in zip(params, ref_params):
        torch.testing.assert_close(got, want, atol=1e-11, rtol=1e-11)


@pytest.mark.parametrize("spec", FOLDING, ids=[s.id for s in FOLDING])
def test_folded_blocks_run_on_meta_device(spec):
    block = _folded_block(spec).to("meta").float()
    out = block(torch.empty(2, 4099, 32, device="meta"))
    assert out.device.type == "meta" and out.shape == (2, 4099, 32)


@pytest.mark.long
@pytest.mark.slow  # compiling takes seconds per backend
@pytest.mark.parametrize("spec", FOLDING, ids=[s.id for s in FOLDING])
def test_folded_blocks_compile_to_one_graph(spec):
    block = _folded_block(spec).float()
    mask = torch.ones(2, 37, dtype=torch.bool)
    mask[0, 30:] = False
    torch._dynamo.reset()
    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    x = torch.randn(2, 37, 32)
    out, (grad,) = with_grads(lambda t: compiled(t, key_padding_mask=mask), [x])
    ref, (ref_grad,) = with_grads(lambda t: block(t, key_padding_mask=mask), [x])
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad, ref_grad, atol=1e-5, rtol=1e-5)
