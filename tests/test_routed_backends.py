"""moba and nsa (and the routing they read): against causal full attention where they must agree,
against their published algorithms written out plainly here, every implementation against the
others (outputs and gradients), and FlexAttention's block lists against the selection."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from attention_zoo import build_attention, get_backend
from attention_zoo.attention import nsa as nsa_module
from attention_zoo.attention.dispatch import Call
from attention_zoo.attention.kernels.flex import TILE
from attention_zoo.attention.kernels.routing import mixed, tiled
from attention_zoo.attention.kernels.routing.compressed import window_route
from attention_zoo.attention.kernels.routing.flex_routed import route_block_mask, routed_flex
from attention_zoo.attention.kernels.routing.gathered import gathered_attention
from attention_zoo.attention.kernels.routing.reference import routed_reference
from attention_zoo.attention.kernels.routing.route import Route, as_blocks, block_means, token_mask
from attention_zoo.attention.kernels.routing.tiled import tiled_attention
from attention_zoo.attention.moba import moba_route
from attention_zoo.attention.nsa import GATES
from attention_zoo.attention.state import StateShape
from attention_zoo.errors import OptionError, UnavailableError
from attention_zoo.measure.cases import BenchCase, build_runnable
from attention_zoo.measure.kernels import kernel_names
from attention_zoo.measure.memory import profiled_peak

from .contract import with_grads

KERNELS = ("tiled", "gathered", "flex", "math")


def _qkv(b=2, h=4, n=45, d=16, kv=None, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    kv = kv or h
    return tuple(torch.randn(b, heads, n, d, generator=g, dtype=dtype) for heads in (h, kv, kv))


def naive_moba(q, k, v, block, top_k):
    """MoBA's brute-force definition, token by token: gate = q . mean(k_block) in float32, blocks
    after the query's -inf, its own +inf, the top_k blocks expanded to keys, AND causal."""
    b, h, n, d = q.shape
    k, v = (t.repeat_interleave(h // t.shape[1], dim=1) for t in (k, v))
    nb = -(-n // block)
    out = torch.zeros_like(q)
    for t in range(n):
        own = t // block
        means = torch.stack([k[:, :, i * block : (i + 1) * block].mean(2) for i in range(nb)], 2)
        gate = torch.einsum("bhd,bhnd->bhn", q[:, :, t].float(), means.float())
        gate[..., own + 1 :] = float("-inf")
        gate[..., own] = float("inf")
        top = gate.topk(min(top_k, nb), dim=-1).indices  # (b, h, k)
        chosen = torch.zeros(b, h, nb, dtype=torch.bool).scatter_(-1, top, True)
        keys = chosen.repeat_interleave(block, dim=-1)[..., : t + 1]  # causal: keys 0..t
        scores = torch.einsum("bhd,bhjd->bhj", q[:, :, t], k[:, :, : t + 1]) * d**-0.5
        p = scores.masked_fill(~keys, float("-inf")).softmax(-1)
        out[:, :, t] = torch.einsum("bhj,bhjd->bhd", p, v[:, :, : t + 1])
    return out


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("kv", [None, 2])
def test_moba_with_every_block_is_causal_full_attention(kernel, kv):
    """top_k >= blocks: every earlier block chosen, so causal SDPA within rounding."""
    for dtype, tol in ((torch.float32, 1e-6), (torch.float64, 1e-10)):
        q, k, v = _qkv(kv=kv, dtype=dtype)
        kw = {} if kv is None else {"kv_heads": kv}
        moba = build_attention("moba", causal=True, device="cpu", block_size=8, top_k=6,
                               kernel=kernel, **kw)  # fmt: skip
        want = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=kv is not None
        )
        torch.testing.assert_close(moba(q, k, v), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("kernel", ["tiled", "math"])
@pytest.mark.parametrize("top_k", [1, 2, 3])
@pytest.mark.parametrize("kv", [None, 2])
def test_moba_equals_its_published_algorithm(top_k, kv, kernel):
    """Small top_k (1: its own block only, as MoBA's naive version) against the definition."""
    q, k, v = _qkv(n=41, kv=kv)
    kw = {} if kv is None else {"kv_heads": kv}
    moba = build_attention(
        "moba", causal=True, device="cpu", block_size=4, top_k=top_k, kernel=kernel, **kw
    )
    out = moba(q, k, v)
    torch.testing.assert_close(out, naive_moba(q, k, v, 4, top_k), atol=1e-10, rtol=1e-10)
    if top_k < 4:  # differs from full attention: the routing is not vacuous
        full = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=kv is not None
        )
        assert (out - full).abs().max() > 1e-3


def test_flex_block_lists_cover_every_allowed_pair():
    """Per (batch, head) the BlockMask lists every key tile holding a key a query may see, and
    lists only tiles one of its queries selected (sparse where the selection is)."""
    n, block = 700, 16
    q, k, _ = _qkv(b=2, h=2, n=n, d=8, seed=2)
    real = torch.ones(2, n, dtype=torch.bool)
    means, has = block_means(k, real, block)
    route = moba_route(q, means, has, block=block, top_k=2)
    allowed = token_mask(route, n, real)  # (b, h, n, n)
    dense = route_block_mask(route, n, real).to_dense().bool()  # (b, h, tiles, tiles)
    nt = -(-n // TILE)
    pad = nt * TILE - n
    tiled = torch.nn.functional.pad(allowed, (0, pad, 0, pad))
    needed = tiled.view(2, 2, nt, TILE, nt, TILE).any(-1).any(-2)
    assert (dense | ~needed).all(), "a tile with an allowed pair is missing from the kv lists"
    assert dense.sum() < torch.ones(nt, nt).tril().sum() * 4, "the lists are not sparse"


def test_moba_route_is_own_block_and_earlier_top_blocks():
    q, k, _ = _qkv(b=1, h=1, n=64, d=8)
    real = torch.ones(1, 64, dtype=torch.bool)
    means, has = block_means(k, real, 8)
    route = moba_route(q, means, has, block=8, top_k=3)
    pos = torch.arange(64)
    assert route.blocks.shape == (1, 1, 64, 3)
    assert route.blocks[0, 0, :, 0].equal(pos // 8)  # own block first, always
    earlier = route.blocks[0, 0, :, 1:]
    used = route.used[0, 0, :, 1:]
    assert (earlier[used] < (pos // 8)[:, None].expand_as(earlier)[used]).all()
    # a query in block i has min(i, 2) earlier blocks to pick
    assert used.sum(-1).equal((pos // 8).clamp(max=2))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"block_size": 0}, "moba option block_size must be an int >= 1, got 0"),
        ({"top_k": 0}, "moba option top_k must be an int >= 1, got 0"),
        (
            {"kernel": "fused"},
            "moba kernel 'fused' is not one of: auto, tiled, gathered, flex, math",
        ),
    ],
)
def test_moba_bad_options_are_one_line_errors(options, message):
    with pytest.raises(OptionError) as err:
        build_attention("moba", causal=True, device="cpu", **options)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_moba_refuses_bidirectional_runs():
    with pytest.raises(OptionError, match="only runs causally"):
        build_attention("moba", device="cpu")


# ---- nsa -----------------------------------------------------------------------------------

SMALL_NSA = dict(block_size=4, num_selected=4, window=6)


def _nsa_inputs(kv=None, n=41, seed=0):
    q, k, v = _qkv(n=n, kv=kv, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    gates = {name: torch.rand(2, 4, n, generator=g, dtype=torch.float64) for name in GATES}
    return q, k, v, gates


def naive_nsa(q, k, v, gates, block, selected, window):
    """NSA token by token (fla's mean pooling): compressed blocks complete at or before the query;
    the first, previous and own blocks and the top others by compressed probability summed over
    the heads sharing a KV head; the window; gated sum."""
    b, h, n, d = q.shape
    group = h // k.shape[1]
    out = torch.zeros_like(q)
    for t in range(n):
        own = t // block
        done = (t + 1) // block  # complete blocks 0 .. done - 1 are visible
        means_k = [k[:, :, i * block : (i + 1) * block].mean(2) for i in range(done)]
        means_v = [v[:, :, i * block : (i + 1) * block].mean(2) for i in range(done)]
        for bi in range(b):
            for hi in range(h):
                kh = hi // group
                qt = q[bi, hi, t]
                o_cmp = torch.zeros(d, dtype=q.dtype)
                if done:
                    kc = torch.stack([m[bi, kh] for m in means_k])
                    vc = torch.stack([m[bi, kh] for m in means_v])
                    o_cmp = (kc @ qt * d**-0.5).softmax(-1) @ vc
                importance = torch.zeros(max(done, 1), dtype=q.dtype)
                for hj in range(kh * group, (kh + 1) * group):
                    if done:
                        kc = torch.stack([m[bi, kh] for m in means_k])
                        importance[:done] += (kc @ q[bi, hj, t] * d**-0.5).softmax(-1)
                chosen = {0, own, max(own - 1, 0)}
                others = [i for i in range(done) if i not in chosen]
                others.sort(key=lambda i: -float(importance[i]))
                chosen |= set(others[: selected - 3])
                keys = [j for j in range(t + 1) if j // block in chosen]
                near = list(range(max(0, t - window + 1), t + 1))
                branch = []
                for js in (keys, near):
                    scores = k[bi, kh, js] @ qt * d**-0.5
                    branch.append(scores.softmax(-1) @ v[bi, kh, js])
                g = {name: gates[name][bi, hi, t] for name in GATES}
                out[bi, hi, t] = (
                    g["g_cmp"] * o_cmp + g["g_slc"] * branch[0] + g["g_swa"] * branch[1]
                )
    return out


@pytest.mark.parametrize("kernel", ["tiled", "math"])
@pytest.mark.parametrize("kv", [None, 2])
def test_nsa_equals_its_algorithm_written_out(kv, kernel):
    q, k, v, gates = _nsa_inputs(kv=kv)
    kw = {} if kv is None else {"kv_heads": kv}
    nsa = build_attention("nsa", causal=True, device="cpu", kernel=kernel, **SMALL_NSA, **kw)
    want = naive_nsa(q, k, v, gates, 4, 4, 6)
    torch.testing.assert_close(nsa(q, k, v, **gates), want, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("kernel", KERNELS)
def test_nsa_selecting_every_block_is_causal_full_attention(kernel):
    """With every block selected (and a window as long as the sequence), the selected and window
    branches are causal SDPA; gates pick one branch at a time."""
    q, k, v, gates = _nsa_inputs(kv=2, n=40)
    full = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=True
    )
    nsa = build_attention("nsa", causal=True, device="cpu", block_size=4, num_selected=10,
                          window=40, kv_heads=2, kernel=kernel)  # fmt: skip
    for branch in ("g_slc", "g_swa"):
        only = {name: torch.full_like(t, float(name == branch)) for name, t in gates.items()}
        torch.testing.assert_close(nsa(q, k, v, **only), full, atol=1e-10, rtol=1e-10)


ROUTED = {
    "moba": dict(block_size=8, top_k=3),
    "nsa": dict(block_size=8, num_selected=4, window=12),
}


@pytest.mark.parametrize("name", sorted(ROUTED))
@pytest.mark.parametrize("kv", [None, 1])
@pytest.mark.parametrize("padded", [False, True], ids=["no-pad", "key-padding"])
def test_implementations_agree_with_gradients(name, kv, padded):
    """tiled, gathered, eager flex and the dense reference: outputs and every gradient (float64),
    the gates of nsa included."""
    _kernels_agree(name, KERNELS, kv, padded, seed=3)


def _kernels_agree(name, kernels, kv, padded, seed):
    """Each kernel's output and gradients equal the last one's (the reference), in float64."""
    q, k, v, gates = _nsa_inputs(kv=kv, n=77, seed=seed)
    gates = gates if name == "nsa" else {}
    mask = None
    if padded:
        mask = torch.ones(2, 77, dtype=torch.bool)
        mask[0, 60:] = False
        mask[1, 10:20] = False
    kw = {} if kv is None else {"kv_heads": kv}
    runs = []
    for kernel in kernels:
        core = build_attention(name, causal=True, device="cpu", kernel=kernel, **ROUTED[name], **kw)

        def run(q, k, v, *g, core=core):
            return core(q, k, v, mask, **dict(zip(gates, g)))

        runs.append(with_grads(run, [q, k, v, *gates.values()]))
    (ref, ref_grads), *others = runs[::-1]  # the last: the reference
    for out, grads in others:
        torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-10)
        for got, want in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


@pytest.mark.slow  # a profiled forward+backward at 4096 tokens: ~1 s
def test_tiled_backward_holds_the_output_gradients_and_one_segment():
    """moba's forward+backward at (1, 4, 4096, 64): the output, dq, dk and dv (4 units) and at
    most one segment's scratch; no copies of the output or the incoming gradient, and no int64
    plan arrays of the pairs' size kept for the backward."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 4096, 64, generator=g, requires_grad=True) for _ in range(3))
    grad = torch.randn(1, 4, 4096, 64, generator=g)
    core = build_attention("moba", causal=True, device="cpu")
    assert core.kernel_for(q, None, k).name == "tiled"

    def step():
        core(q, k, v).backward(grad)
        q.grad = k.grad = v.grad = None

    step()
    peak = profiled_peak(step)[1].peak_bytes
    assert peak <= 4 * q.numel() * q.element_size() + tiled.SCRATCH_BYTES, peak


@pytest.fixture
def mixed_always(monkeypatch):
    """nsa's CPU node at every length (it runs on long inputs); the test must have run it."""
    monkeypatch.setattr(nsa_module, "pays", lambda *shape: True)
    calls = []
    apply = nsa_module.MixedNSA.apply
    monkeypatch.setattr(nsa_module.MixedNSA, "apply", lambda *a: calls.append(1) or apply(*a))
    yield
    assert calls, "the node never ran"


@pytest.mark.parametrize("kv", [None, 1])
@pytest.mark.parametrize("padded", [False, True], ids=["no-pad", "key-padding"])
def test_nsa_mixed_node_agrees_with_the_reference(mixed_always, kv, padded):
    """The one-node form of nsa's branches: output and every gradient (gates included) equal the
    dense reference's, in float64."""
    _kernels_agree("nsa", ("tiled", "math"), kv, padded, seed=4)


@pytest.mark.parametrize(
    ("name", "options", "dense_below"),
    [
        ("moba", dict(block_size=16, top_k=3), 300),  # 100 keys per slot
        ("nsa", dict(block_size=16, num_selected=4, window=16), 400),
        ("moba", dict(block_size=128, top_k=2), 257),  # the route reads every key up to 256
    ],
)
def test_auto_runs_the_dense_reference_where_the_tiles_do_not_pay(name, options, dense_below):
    """On the CPU, under DENSE_UP_TO tokens, the key-block tiles run from TILES_PAY_FROM keys
    per route slot, and only where the route reads fewer keys than there are; shorter inputs run
    `math`, on meta too."""
    core = build_attention(name, causal=True, device="cpu", **options)
    for device in ("cpu", "meta"):
        picks = [
            core.pick(Call(device, torch.float32, n, 64, fake=device == "meta")).name
            for n in (dense_below - 1, dense_below)
        ]
        assert picks == ["math", "tiled"]
    tiled = build_attention(name, causal=True, device="cpu", kernel="tiled", **options)
    assert tiled.pick(Call("cpu", torch.float32, 32, 64)).name == "tiled"


def test_auto_keeps_the_tiles_from_1024_tokens_and_in_16_bits():
    """The dense product's (t, n) scores grow with the length, and it scores in the input's
    dtype: auto keeps the tiles from DENSE_UP_TO tokens, and in 16-bit dtypes at any length."""
    wide = build_attention("moba", causal=True, device="cpu", block_size=128, top_k=16)
    assert [wide.pick(Call("cpu", torch.float32, n, 64)).name for n in (1023, 1024)] == [
        "math",
        "tiled",
    ]
    core = build_attention("moba", causal=True, device="cpu", block_size=16, top_k=3)
    for dtype in (torch.bfloat16, torch.float16):
        assert core.pick(Call("cpu", dtype, 128, 64)).name == "tiled"
    assert core.pick(Call("cpu", torch.float64, 128, 64)).name == "math"


def test_nsa_mixed_node_runs_on_long_inputs_only(monkeypatch):
    """Inputs whose outputs are small beside the tiles' scratch run the branches one by one;
    long ones run the node, with or without a backward to follow (a recomputed forward, as a
    reversible residual's, computes what the forward did)."""
    assert not nsa_module.pays(4, 1024, 64)
    assert nsa_module.pays(4, 16384, 64)
    calls = []
    monkeypatch.setattr(nsa_module.MixedNSA, "apply", lambda *a: calls.append(a) or a[0])
    core = build_attention("nsa", causal=True, device="cpu", kernel="tiled", **ROUTED["nsa"])
    q, k, v, gates = _nsa_inputs(n=40)
    core(q, k, v, **gates)
    assert not calls
    monkeypatch.setattr(nsa_module, "pays", lambda *shape: True)
    with torch.no_grad():
        core(q, k, v, **gates)
    core(q.requires_grad_(), k, v, **gates)
    assert len(calls) == 2


def test_nsa_mixed_node_under_saved_tensor_hooks_keeps_no_outputs(mixed_always):
    """Under checkpointing or offloading hooks the node keeps no outputs of its own (the hooks
    would not see them); its backward remakes them and gives the same gradients."""
    q, k, v, gates = _nsa_inputs(kv=2, n=50, seed=8)
    core = build_attention(
        "nsa", causal=True, device="cpu", kv_heads=2, kernel="tiled", **ROUTED["nsa"]
    )
    seen = []
    forward = nsa_module.MixedNSA.forward

    def spying(ctx, *args):
        out = forward(ctx, *args)
        seen.append(ctx.outputs)
        return out

    def run(*x):
        return core(*x[:3], **dict(zip(GATES, x[3:])))

    inputs = [q, k, v, *gates.values()]
    plain = with_grads(run, inputs)
    with mock.patch.object(nsa_module.MixedNSA, "forward", staticmethod(spying)):
        with torch.autograd.graph.save_on_cpu():
            hooked = with_grads(run, inputs)
    assert seen == [None]
    torch.testing.assert_close(hooked[0], plain[0], atol=0, rtol=0)
    for got, want in zip(hooked[1], plain[1], strict=True):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


@pytest.mark.slow  # a profiled forward and backward at 4096 tokens: ~1 s
def test_nsa_tiled_keeps_two_branch_outputs_and_one_set_of_gradients(mixed_always):
    """nsa's CPU node at (1, 4, 4096, 64): the forward leaves its output and the selected and
    window branches' outputs (the compressed one is recomputed), an inference forward none; the
    backward frees those two before it makes the gradients, and makes one set of dq, dk, dv."""
    g = torch.Generator().manual_seed(0)
    core = build_attention("nsa", causal=True, device="cpu")
    x = core.layout.sample(1, 4, 4096, 64, requires_grad=True, generator=g)
    assert core.kernel_for(x.q, None, x.k).name == "tiled"
    unit = x.q.numel() * x.q.element_size()
    grad = torch.randn(1, 4, 4096, 64, generator=g)
    held = {}

    def forward():
        held["loss"] = torch.linalg.vecdot(core(x.q, x.k, x.v, **x.extras), grad).sum()

    def backward():
        held.pop("loss").backward()
        for t in x.leaves():
            t.grad = None

    def inference():
        with torch.no_grad():
            core(x.q, x.k, x.v, **x.extras)

    forward(), backward(), inference()
    forward_peak = profiled_peak(forward)[1]
    # two branch outputs and the tiles' plans (the autograd composition keeps three outputs)
    assert forward_peak.net_bytes <= 2.5 * unit, forward_peak.net_bytes / unit
    # without a backward to follow, a branch's output is freed once added in
    inference_peak = profiled_peak(inference)[1].peak_bytes
    assert inference_peak <= forward_peak.peak_bytes - 0.9 * unit, inference_peak / unit
    backward_peak = profiled_peak(backward)[1].peak_bytes
    assert backward_peak <= 3 * unit + mixed.SCRATCH_BYTES, backward_peak / unit


def test_nsa_tiled_backward_twice_through_a_retained_graph(mixed_always):
    """The node drops its branch outputs in the backward: a second backward remakes them."""
    q, k, v, gates = _nsa_inputs(kv=2, n=50, seed=5)
    leaves = [t.requires_grad_() for t in (q, k, v, *gates.values())]
    nsa = build_attention("nsa", causal=True, device="cpu", kv_heads=2, kernel="tiled",
                          **ROUTED["nsa"])  # fmt: skip
    out = nsa(q, k, v, **gates)
    first = torch.autograd.grad(out.sum(), leaves, retain_graph=True)
    second = torch.autograd.grad(out.sum(), leaves)
    for a, b in zip(first, second, strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_nsa_declares_its_gates_as_inputs():
    layout = get_backend("nsa").layout(kv_heads=2)
    assert [e.name for e in layout.extras] == list(GATES)
    assert layout.projections(4, 16) == {"q": 64, "k": 32, "v": 32, **dict.fromkeys(GATES, 4)}
    x = layout.sample(1, 4, 50, 16)
    assert all(((t > 0) & (t < 1)).all() for t in x.extras.values())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"num_selected": 2}, "nsa option num_selected must be an int >= 3, got 2"),
        ({"window": 0}, "nsa option window must be an int >= 1, got 0"),
    ],
)
def test_nsa_bad_options_are_one_line_errors(options, message):
    with pytest.raises(OptionError) as err:
        build_attention("nsa", causal=True, device="cpu", **options)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("kernel", ["tiled", "gathered", "flex"])
def test_a_window_route_is_the_band_in_every_kernel(kernel):
    """A route with a window (nsa's window branch while decoding): the keys at most window - 1
    back, outputs and gradients as the dense reference, through a padded gap."""
    q, k, v = _qkv(n=50, kv=2, seed=4)
    real = torch.ones(2, 50, dtype=torch.bool)
    real[1, 20:31] = False  # queries 30 and 31 see no real key in their window
    route = window_route(2, 4, 50, block=4, window=10, offset=0, device=q.device)
    attend = {"tiled": tiled_attention, "gathered": gathered_attention, "flex": routed_flex}
    out, grads = with_grads(lambda q, k, v: attend[kernel](q, k, v, route, real), [q, k, v])
    ref, ref_grads = with_grads(lambda q, k, v: routed_reference(q, k, v, route, real), [q, k, v])
    i = torch.arange(50)
    band = (i[:, None] - i[None, :] >= 0) & (i[:, None] - i[None, :] < 10)
    assert token_mask(route, 50, real)[0, 0].equal(band)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-10)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


def _two_block_route(n: int, block: int) -> Route:
    """Each query reads its own block and (from the second block on) the first."""
    own = torch.arange(n) // block
    blocks = torch.stack([own, torch.zeros(n, dtype=torch.long)], -1).view(1, 1, n, 2)
    used = torch.stack([torch.ones(n, dtype=torch.bool), own > 0], -1).view(1, 1, n, 2)
    return Route(blocks, used, block)


def test_tiled_decides_what_a_query_sees_by_its_mask_not_its_scores():
    """Real scores far below zero (-6e8, past half the mask value) are still a softmax, and a
    pair that sees only padding adds nothing, even where the padding's values are huge."""
    n, block = 8, 4
    route, real = _two_block_route(n, block), torch.ones(1, n, dtype=torch.bool)
    q = torch.full((1, 1, n, 1), -1.0, dtype=torch.float64)
    k = (6e8 + torch.arange(n, dtype=torch.float64)).view(1, 1, n, 1)  # scores -6e8 - j
    v = torch.arange(1.0, n + 1, dtype=torch.float64).view(1, 1, n, 1)
    got_out, got_grads = with_grads(lambda *x: tiled_attention(*x, route, real), [q, k, v])
    want_out, want_grads = with_grads(lambda *x: routed_reference(*x, route, real), [q, k, v])
    torch.testing.assert_close(got_out, want_out)
    torch.testing.assert_close(got_grads[2], want_grads[2])  # v's: q's and k's are 0 * huge
    real[:, :block] = False  # block 0 all padding, its values huge but finite
    q, k = torch.randn(1, 1, n, 4), torch.randn(1, 1, n, 4)
    v = torch.randn(1, 1, n, 4)
    v[:, :, :block] = 1e38
    torch.testing.assert_close(
        tiled_attention(q, k, v, route, real), routed_reference(q, k, v, route, real)
    )


def test_nsa_window_branch_stays_the_built_in_sliding_window_when_a_plugin_replaces_it():
    """nsa's window branch is the built-in sliding-window core even after a plugin registers
    another core under that name (stored nsa numbers mean one computation)."""
    from attention_zoo.attention.spec import BACKENDS, register_attention

    built_in = BACKENDS.get("sliding-window")

    class Replacement(built_in.cls):
        """A plugin's sliding-window."""

    register_attention("sliding-window", config=built_in.config, replace=True)(Replacement)
    try:
        core = build_attention("nsa", causal=True, device="cpu")
    finally:
        BACKENDS.add("sliding-window", built_in, replace=True)
    assert type(core.window_core) is built_in.cls


@pytest.mark.parametrize("name", sorted(ROUTED))
def test_a_routed_decoding_state_holds_whole_blocks(name):
    """max_length not a multiple of the block: the cache is allocated in whole blocks, so a step
    reads it as blocks (a view), not as a zero-padded copy of the whole cache every token."""
    core = build_attention(name, causal=True, block_size=4)
    shape = StateShape(1, 2, 8, max_length=10)
    state = core.init_state(shape)
    assert state.k.shape[2] == state.v.shape[2] == state.real.shape[1] == 12
    assert as_blocks(state.k, 4).data_ptr() == state.k.data_ptr()
    assert core.state_bytes(shape) == state.nbytes()


@pytest.mark.parametrize(
    ("mode", "length", "reported"),
    [
        ("forward+backward", 16384, {"nsa": "tiled"}),
        ("forward", 16384, {"nsa": "tiled"}),
        ("forward+backward", 1024, {"nsa": "tiled", "sliding-window": "cpu-fused"}),
    ],
)
def test_nsa_reports_its_window_kernel_only_where_it_runs(mode, length, reported):
    """A case's kernels name the window core where the branches run one by one, and leave it out
    where the one node computes the window on tiles (long inputs)."""
    case = BenchCase(target="attention", backend="nsa", seq_len=length, mode=mode, causal=True)
    with FakeTensorMode():
        module = build_runnable(case, "meta").module
    assert kernel_names(case, module) == reported


def test_a_model_case_reports_the_kernels_of_its_own_heads():
    """A model case's overrides set the heads its attention runs with: one head of 64 at 8192
    tokens is too small for nsa's node, four heads (the case's own) are not."""
    reported = {}
    for heads in (1, 4):
        case = BenchCase(target="model", backend="nsa", seq_len=8192, mode="forward",
                         causal=True, model={"num_attention_heads": heads,
                                             "attention_head_size": 64})  # fmt: skip
        assert case.attention_shape() == (heads, 64)
        with FakeTensorMode():
            module = build_runnable(case, "meta").module
        reported[heads] = kernel_names(case, module)
    assert reported == {1: {"nsa": "tiled", "sliding-window": "cpu-fused"}, 4: {"nsa": "tiled"}}


def test_nsa_mixed_node_in_bfloat16_matches_the_branches_one_by_one(mixed_always, monkeypatch):
    """16-bit inputs: the node (float32 scores and sums inside) and the composition agree to
    bfloat16's rounding, gradients included."""
    q, k, v, *gates = (x.to(torch.bfloat16) for x in _nsa_inputs_flat(kv=2, n=70, seed=6))
    core = build_attention(
        "nsa", causal=True, device="cpu", kv_heads=2, kernel="tiled", **ROUTED["nsa"]
    )
    node = with_grads(lambda *x: core(*x[:3], **dict(zip(GATES, x[3:]))), [q, k, v, *gates])
    monkeypatch.setattr(nsa_module, "pays", lambda *shape: False)
    one_by_one = with_grads(lambda *x: core(*x[:3], **dict(zip(GATES, x[3:]))), [q, k, v, *gates])
    assert node[0].dtype == one_by_one[0].dtype == torch.bfloat16
    torch.testing.assert_close(node[0], one_by_one[0], atol=2e-2, rtol=2e-2)
    for got, want in zip(node[1], one_by_one[1], strict=True):
        torch.testing.assert_close(got, want, atol=5e-2, rtol=5e-2)


def test_nsa_mixed_node_refuses_a_double_backward(mixed_always):
    """Its backward is not differentiable: asking for a graph of it raises, not a wrong number."""
    q, k, v, gates = _nsa_inputs(n=30)
    leaves = [t.requires_grad_() for t in (q, k, v, *gates.values())]
    core = build_attention("nsa", causal=True, device="cpu", kernel="tiled", **ROUTED["nsa"])
    with pytest.raises(UnavailableError, match=r"\(MixedNSA\) .*\(create_graph=True\)"):
        torch.autograd.grad(core(q, k, v, **gates).sum(), leaves[:1], create_graph=True)


def _nsa_inputs_flat(**kw):
    q, k, v, gates = _nsa_inputs(**kw)
    return (q, k, v, *gates.values())
