"""nystrom and linformer: landmarks covering every token give softmax attention, padding rules,
the residual conv, the length limit, and the one-line errors."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode

from attention_zoo import SelfAttention, build_attention
from attention_zoo.attention.base import BlockWeights
from attention_zoo.attention.kernels.low_rank import projected as low_rank
from attention_zoo.errors import InputError, OptionError
from attention_zoo.measure import profiled_peak
from attention_zoo.measure.cases import BenchCase, build_runnable


def _qkv(n: int, *, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, 2, n, 16, generator=g, dtype=torch.float64) for _ in "qkv")


def _padding(n: int) -> torch.Tensor:
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[0, n - 6 :] = False
    mask[1, 2:5] = False
    return mask


@pytest.mark.parametrize("landmarks", [20, 32], ids=["n-landmarks", "more-landmarks"])
def test_nystrom_with_a_landmark_per_token_is_softmax_attention(landmarks):
    """Landmarks = the tokens: softmax(QK^T) pinv(softmax(QK^T)) softmax(QK^T) V = softmax V.
    Sharp (unit-normal) scores need more than the paper's 6 pseudo-inverse iterations."""
    q, k, v = _qkv(20)
    mask = _padding(20)
    attn = build_attention("nystrom", num_landmarks=landmarks, pinv_iterations=20)
    want = build_attention("full")(q, k, v, key_padding_mask=mask)
    torch.testing.assert_close(attn(q, k, v, key_padding_mask=mask), want, atol=1e-9, rtol=0)


@pytest.mark.parametrize("name", ["nystrom", "linformer"])
def test_padded_tokens_content_changes_nothing(name):
    q, k, v = _qkv(45)
    mask = _padding(45)
    options = {"num_landmarks": 8} if name == "nystrom" else {"proj_length": 8}
    attn = build_attention(name, **options)
    noisy = [t.clone() for t in (q, k, v)]
    for t in noisy:
        t[~mask[:, None, :].expand(-1, 2, -1)] = 100.0
    out, ref = attn(*noisy, key_padding_mask=mask), attn(q, k, v, key_padding_mask=mask)
    real = mask[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out[real], ref[real], atol=1e-10, rtol=0)


def test_nystrom_conv_is_a_per_head_parameter_that_learns():
    block = SelfAttention(32, 4, "nystrom", num_landmarks=8, conv_kernel=3)
    assert block.core.conv.weight.shape == (4, 1, 3, 1)
    x = torch.randn(2, 37, 32)
    block(x).square().sum().backward()
    assert block.core.conv.weight.grad.abs().sum() > 0


def test_nystrom_option_errors():
    with pytest.raises(OptionError, match="conv_kernel=3 needs heads=<number of heads>"):
        build_attention("nystrom", conv_kernel=3)
    with pytest.raises(OptionError, match=r"conv_kernel must be 0 \(off\) or odd"):
        build_attention("nystrom", conv_kernel=4, heads=2)
    with pytest.raises(OptionError, match="num_landmarks must be an int >= 1"):
        build_attention("nystrom", num_landmarks=0)


@pytest.mark.parametrize("share_kv", [True, False], ids=["shared", "separate"])
@pytest.mark.parametrize("layout", ["dense", "block"])
def test_linformer_kernel_gradients_equal_plain_autograd(share_kv, layout):
    """The fused kernel's forward and hand-written backward (segments, recomputed probabilities,
    the projection gradient built in place, zero past n) against autograd through matmul and
    SDPA, in float64: q, k, v and both projections, with padding and n < max_length. "block"
    gives the kernel the (b, n, h, d) layout of SelfAttention's projections at batch 1."""
    n = 45
    attn = build_attention("linformer", proj_length=8, max_length=64, share_kv=share_kv).double()
    g = torch.Generator().manual_seed(1)
    if layout == "block":
        q, k, v = (torch.randn(1, n, 2, 16, generator=g, dtype=torch.float64).transpose(1, 2)
                   for _ in "qkv")  # fmt: skip
        mask = None
    else:
        q, k, v = _qkv(n)
        mask = _padding(n)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    leaves = [q, k, v, *attn.parameters()]
    weight = torch.randn(q.shape, generator=g, dtype=torch.float64)

    def plain():
        keys, values = k, v
        if mask is not None:
            keep = mask[:, None, :, None].double()
            keys, values = k * keep, v * keep
        proj_k = attn.proj_k[:, :n]
        proj_v = proj_k if attn.proj_v is None else attn.proj_v[:, :n]
        return F.scaled_dot_product_attention(q, proj_k @ keys, proj_v @ values)

    out = attn(q, k, v, key_padding_mask=mask)
    want = plain()
    torch.testing.assert_close(out, want, atol=1e-12, rtol=0)
    got_grads = torch.autograd.grad((out * weight).sum(), leaves)
    want_grads = torch.autograd.grad((want * weight).sum(), leaves)
    for got, ref in zip(got_grads, want_grads):
        torch.testing.assert_close(got, ref, atol=1e-10, rtol=0)


def test_linformer_longer_than_max_length_is_one_line_error():
    attn = build_attention("linformer", proj_length=4, max_length=16)
    q, k, v = _qkv(17)
    with pytest.raises(InputError) as err:
        attn(q, k, v)
    assert str(err.value) == (
        "linformer got 17 positions, more than its max_length=16; build it with max_length >= 17"
    )


def test_linformer_share_kv():
    assert build_attention("linformer", share_kv=True).proj_v is None
    separate = build_attention("linformer", share_kv=False, proj_length=8, max_length=64)
    assert separate.proj_v.shape == separate.proj_k.shape == (8, 64)


@pytest.mark.parametrize("name", ["nystrom", "linformer"])
def test_causal_request_names_what_works(name):
    with pytest.raises(OptionError) as err:
        build_attention(name, causal=True)
    message = str(err.value)
    assert "\n" not in message and f"{name!r} cannot run causally" in message
    assert "linear" in message and "performer" in message  # causal approximations that work


def test_a_model_gives_nystrom_its_head_count_also_when_it_rebuilds_the_core():
    from attention_zoo import ReformerModel

    from .reformer_cases import tiny_config

    config = tiny_config(
        is_decoder=False,
        attn_layers=("full", "nystrom"),
        attn_options={"nystrom": {"conv_kernel": 3, "num_landmarks": 4}},
    )
    model = ReformerModel(config)
    assert model.layers[1].attention.core.conv.weight.shape == (2, 1, 3, 1)
    model.set_attention_options("nystrom", conv_kernel=5)  # the model rebuilds the core
    assert model.layers[1].attention.core.conv.weight.shape == (2, 1, 5, 1)
    assert torch.isfinite(model(torch.randint(0, 13, (2, 12))).last_hidden_state).all()


def _measured_peak(backend: str, n: int, **options) -> int:
    """Profiled peak of one warmed-up forward+backward, as `zoo bench --target attention`
    measures it (1 batch, 4 heads of 64, float32)."""
    case = BenchCase(
        target="attention", backend=backend, seq_len=n, batch=1, num_heads=4, head_dim=64,
        dtype="float32", causal=False, mode="forward+backward", options=options,
    )  # fmt: skip
    runnable = build_runnable(case)
    runnable.step()
    return profiled_peak(runnable.step)[1].peak_bytes


@pytest.mark.slow  # profiled forward+backward of two backends (the profiler's start: seconds)
def test_linformer_peak_memory_stays_below_sdpa(monkeypatch):
    """Its (k, n) projection gradient is as large as one input gradient here (k = 4 x 64), and
    still the peak stays under SDPA's: no output, no (n, k) scores and no transposed copies of k
    and v are kept, and the projection gradient is built in place (autograd through matmul and
    SDPA peaked at 1.17x). The segments' scratch, a constant, is scaled to this short length as
    it is at 16k (1/8 of one input)."""
    n = 1024
    monkeypatch.setattr(low_rank, "SCRATCH_BYTES", n * 4 * 64 * 4 // 8)
    ratio = _measured_peak("linformer", n, max_length=n) / _measured_peak("sdpa", n)
    assert ratio <= 0.95, ratio


SMALL = {"nystrom": {"num_landmarks": 8}, "linformer": {"proj_length": 16, "max_length": 128}}


def _unfolded(block: SelfAttention, key_padding_mask: torch.Tensor | None = None):
    """The block as projections around its core, q, k and v materialised (no folding)."""

    def run(x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        heads = [
            F.linear(x, w).view(b, n, block.num_heads, -1).transpose(1, 2)
            for w in block.in_proj.weight.split(block.num_heads * block.head_size)
        ]
        out = block.core(*heads, key_padding_mask=key_padding_mask)
        return block.out_proj(out.transpose(1, 2).reshape(b, n, -1))

    return run


def _flops(fn, x: torch.Tensor) -> int:
    x = x.clone().requires_grad_()
    with FlopCounterMode(display=False) as counter:
        fn(x).sum().backward()
    return counter.get_total_flops()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "options", "most"),
    [("nystrom", {}, 0.85), ("linformer", {"max_length": 2048}, 0.7)],
    ids=["nystrom", "linformer"],
)
def test_the_block_folds_its_maps_into_the_core_in_fewer_flops(name, options, most):
    """Forward+backward of the block (4 heads of 64, default landmarks / projection length) at
    2048 positions: the folded path counts at most this fraction of projecting q, k, v first."""
    block = SelfAttention(256, 4, name, **options)
    x = torch.randn(1, 2048, 256)
    ratio = _flops(block, x) / _flops(_unfolded(block), x)
    assert ratio <= most, ratio


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("nystrom", {"dropout": 0.1}),
        ("linformer", {"dropout": 0.1}),
        ("nystrom", {"conv_kernel": 3}),
    ],
    ids=["nystrom-dropout", "linformer-dropout", "nystrom-conv"],
)
def test_the_block_projects_where_the_core_needs_q_k_v(name, options):
    """Dropout on the attention probabilities (training) and nystrom's conv on v need the
    per-head tensors: the core then declines to fold and the block projects, as before."""
    block = SelfAttention(32, 4, name, **SMALL[name], **options)
    x = torch.randn(2, 21, 32)
    w = block.in_proj.weight.split(32)
    weights = BlockWeights(*w, block.out_proj.weight, 4)
    assert block.core.attend_block(x, weights, None) is None
    torch.manual_seed(0)
    out = block(x)
    torch.manual_seed(0)
    torch.testing.assert_close(out, _unfolded(block)(x))
    if "dropout" in options:  # in eval mode there is no dropout: it folds
        assert block.eval().core.attend_block(x, weights, None) is not None


def test_linformer_block_longer_than_max_length_is_the_cores_error():
    block = SelfAttention(32, 4, "linformer", proj_length=4, max_length=16)
    with pytest.raises(
        InputError, match=r"^linformer got 17 positions, more than its max_length=16"
    ):
        block(torch.randn(1, 17, 32))


@pytest.mark.parametrize(("name", "kernel"), [("nystrom", "math"), ("linformer", "cpu-fused")])
def test_folded_block_in_bfloat16_is_its_float32_result_rounded(name, kernel):
    """bfloat16 in and out, computed in float32 inside (compute_dtype) by the kernels that do
    (auto takes sdpa in bfloat16 on the CPU: in the input's dtype): the float32 block with the
    same (bfloat16-exact) weights, rounded once, within one bfloat16 step. Projecting q, k and v
    in bfloat16 first misses this by hundreds of steps."""
    block = SelfAttention(64, 4, name, kernel=kernel, **SMALL[name]).to(torch.bfloat16)
    x = torch.randn(2, 100, 64).to(torch.bfloat16)
    mask = _padding(100)
    got = block(x, key_padding_mask=mask)
    assert got.dtype == torch.bfloat16
    want = block.float()(x.float(), key_padding_mask=mask).to(torch.bfloat16)
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-8, atol=1e-5)


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("nystrom", {"num_heads": 8}),  # head_size 32 < 64 landmarks
        ("nystrom", {"num_landmarks": 128}),
        ("linformer", {"head_size": 16, "max_length": 512}),  # inner 64: a quarter of hidden
    ],
    ids=["nystrom-small-heads", "nystrom-many-landmarks", "linformer-narrow-heads"],
)
def test_the_block_projects_where_folding_costs_more(name, options):
    """Folding trades the projections for products with hidden columns: where those cost more
    the core declines and the block's FLOPs are the projecting path's."""
    options = dict(options)
    heads = options.pop("num_heads", 4)
    block = SelfAttention(256, heads, name, **options)
    x = torch.randn(1, 512, 256)
    inner = block.num_heads * block.head_size
    w = block.in_proj.weight.split(inner)
    assert block.core.attend_block(x, BlockWeights(*w, block.out_proj.weight, heads), None) is None
    assert _flops(block, x) == _flops(_unfolded(block), x)


def test_linformer_separate_projections_fold_to_the_same_block():
    """share_kv=False: keys and values through their own sequence projections, folded; output
    and every gradient (proj_v's included) equal the projecting path (float64, padded)."""
    block = SelfAttention(32, 4, "linformer", share_kv=False, **SMALL["linformer"]).double()
    x, mask = torch.randn(2, 45, 32, dtype=torch.float64), _padding(45)
    runs = []
    for fn in (lambda t: block(t, key_padding_mask=mask), _unfolded(block, mask)):
        block.zero_grad()
        leaf = x.clone().requires_grad_()
        out = fn(leaf)
        out.square().sum().backward()
        runs.append([out.detach(), leaf.grad, *(p.grad.clone() for p in block.parameters())])
    assert block.core.proj_v.grad is not None
    for got, want in zip(*runs):
        torch.testing.assert_close(got, want, atol=1e-11, rtol=1e-11)


@pytest.mark.parametrize("name", ["nystrom", "linformer"])
def test_the_block_projects_under_autocast_and_mixed_dtypes(name):
    """Autocast casts each projection on its own, and a bfloat16 input to a float32 block is the
    projections' error: the block leaves both to the projecting path, whose core computes in
    the dtype it chose (forward and backward, both under autocast)."""
    block = SelfAttention(32, 4, name, **SMALL[name])
    x = torch.randn(2, 21, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, want = block(x), _unfolded(block)(x)
        got.float().square().sum().backward()
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want)
    assert all(torch.isfinite(p.grad).all() for p in block.parameters())
    with pytest.raises(RuntimeError, match="dtype"):
        block(x.to(torch.bfloat16))
