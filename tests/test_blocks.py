"""Blocks: chunked feed-forward, axial positions, RNG replay, residual stacks' memory."""

from __future__ import annotations

import math
import re
from functools import partial

import pytest
import torch

from attention_zoo import ShapeError
from attention_zoo.blocks import (
    RESIDUALS,
    AxialPositionEmbedding,
    ChunkedFeedForward,
    ReversibleResidual,
    TablePositionEmbedding,
)
from attention_zoo.errors import UnavailableError
from attention_zoo.measure import profiled_peak
from attention_zoo.model import build_layer
from attention_zoo.rng import record_rng, replay_rng

from .reformer_cases import tiny_config

# ---- chunked feed-forward ----------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [1, 3, 4, 5, 7, 12, 100])
def test_chunked_ffn_equals_unchunked(chunk: int) -> None:
    """n = 12: chunk sizes that divide it (1, 3, 4, 12), that do not (5, 7) and that exceed it."""
    whole = ChunkedFeedForward(8, 32, activation="gelu", chunk_size=0).double()
    sliced = ChunkedFeedForward(8, 32, activation="gelu", chunk_size=chunk).double()
    sliced.load_state_dict(whole.state_dict())
    x = torch.randn(2, 12, 8, dtype=torch.float64, requires_grad=True)
    out_whole, out_sliced = whole(x), sliced(x)
    torch.testing.assert_close(out_sliced, out_whole, atol=1e-6, rtol=0)
    g = torch.randn_like(out_whole)
    dx_whole, *dp_whole = torch.autograd.grad(out_whole, (x, *whole.parameters()), g)
    dx_sliced, *dp_sliced = torch.autograd.grad(out_sliced, (x, *sliced.parameters()), g)
    torch.testing.assert_close(dx_sliced, dx_whole, atol=1e-6, rtol=0)
    for a, b in zip(dp_sliced, dp_whole):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_chunked_ffn_bounds_the_intermediate() -> None:
    """The (n, d_ff) intermediate exists a slice at a time: inference peak drops with the chunk."""
    x = torch.randn(1, 512, 16)
    peaks = {}
    for chunk in (0, 64):
        ffn = ChunkedFeedForward(16, 1024, chunk_size=chunk)
        with torch.no_grad():
            _, mem = profiled_peak(partial(ffn, x))
        peaks[chunk] = mem.peak_bytes
    intermediate = 512 * 1024 * 4
    assert peaks[0] >= intermediate
    assert peaks[64] < peaks[0] / 4


# ---- positions ---------------------------------------------------------------------------------


def test_axial_parameter_count_and_layout() -> None:
    """HF's layout: weights (n1, 1, d1), (1, n2, d2); position j: [E1[j // n2], E2[j % n2]]."""
    emb = AxialPositionEmbedding((4, 8), (6, 10))
    assert sum(p.numel() for p in emb.parameters()) == 4 * 6 + 8 * 10
    e1, e2 = emb.weights
    assert e1.shape == (4, 1, 6) and e2.shape == (1, 8, 10)
    table = emb(32)[0]
    assert table.shape == (32, 16)
    for j in (0, 3, 4, 17, 31):
        torch.testing.assert_close(table[j], torch.cat([e1[j // 8, 0], e2[0, j % 8]]))
    # the same as broadcasting the factors over the (n1, n2) grid and flattening it row-major
    grid = torch.cat([e1.expand(4, 8, 6), e2.expand(4, 8, 10)], dim=-1).reshape(32, 16)
    torch.testing.assert_close(table, grid)


def test_three_axial_factors_are_row_major() -> None:
    emb = AxialPositionEmbedding((2, 3, 4), (2, 3, 5))
    grid = torch.cat([w.expand(2, 3, 4, w.shape[-1]) for w in emb.weights], dim=-1)
    torch.testing.assert_close(emb(24)[0], grid.reshape(24, 10))


def test_axial_dropout_drops_whole_grid_columns() -> None:
    """HF's axial dropout (dropout2d over the second axis): per sequence, a column j % n2 of the
    grid is kept (scaled by 1 / (1 - p)) or dropped at every position and width."""
    emb = AxialPositionEmbedding((4, 8), (6, 10), dropout=0.5).train()
    torch.manual_seed(0)
    out = emb(29, batch=64)
    clean = emb.eval()(29)
    assert out.shape == (64, 29, 16)
    ratio = out / clean  # 0 or 2 everywhere
    assert set(ratio.unique().tolist()) == {0.0, 2.0}
    column = ratio[:, :8, 0]  # (batch, n2): every position with the same j % 8 agrees
    j = torch.arange(29)
    torch.testing.assert_close(ratio, column[:, j % 8, None].expand(-1, -1, 16))
    assert 0.3 < (column == 0).float().mean() < 0.7


def test_every_axial_position_is_distinct() -> None:
    table = AxialPositionEmbedding((4, 8), (6, 10))(32)[0]
    distances = torch.cdist(table, table) + torch.eye(32) * 1e9
    assert distances.min() > 1e-3


def test_shorter_sequences_use_a_prefix_and_longer_ones_name_the_limit() -> None:
    emb = AxialPositionEmbedding((4, 8), (6, 10))
    torch.testing.assert_close(emb(7), emb(32)[:, :7])
    with pytest.raises(
        ShapeError, match=re.escape("sequence length 33 is outside 1..32, the axial_pos_shape")
    ):
        emb(33)
    with pytest.raises(ShapeError, match="max_position_embeddings=10"):
        TablePositionEmbedding(10, 4)(11)


def test_crime_and_punishment_position_parameters() -> None:
    """HF's shape (512, 1024), dims (64, 192), hidden 256: counted on meta, nothing allocated."""
    with torch.device("meta"):
        axial = AxialPositionEmbedding((512, 1024), (64, 192))
        table = TablePositionEmbedding(512 * 1024, 256)
    assert sum(p.numel() for p in axial.parameters()) == 229_376 == 512 * 64 + 1024 * 192
    assert sum(p.numel() for p in table.parameters()) == 134_217_728 == 524_288 * 256
    assert axial(524_288).shape == (1, 524_288, 256)  # runs on meta too


# ---- RNG replay --------------------------------------------------------------------------------


def test_replay_draws_the_same_numbers_and_leaves_the_rng_alone() -> None:
    state = record_rng("cpu")
    first = torch.rand(5)
    after = torch.get_rng_state()
    with replay_rng(state):
        again = torch.rand(5)
    torch.testing.assert_close(again, first)
    assert torch.equal(torch.get_rng_state(), after)


# ---- residual stacks ---------------------------------------------------------------------------


def _stack(residual: str, layers: int, **kw) -> torch.nn.Module:
    cfg = tiny_config(
        hidden_size=64,
        axial_pos_embds_dim=(32, 32),
        feed_forward_size=256,
        num_hidden_layers=layers,
        residual=residual,
        **kw,
    )
    return RESIDUALS.get(residual)([build_layer(cfg, i, "cpu") for i in range(layers)])


def _kept_after_forward(residual: str, layers: int) -> int:
    torch.manual_seed(0)
    stack = _stack(residual, layers)
    x = torch.randn(1, 256, 64, requires_grad=True)
    out, mem = profiled_peak(lambda: stack(x))
    return mem.net_bytes - out.numel() * out.element_size()


@pytest.mark.slow  # six model forwards under the storage tracker: ~3 s
def test_reversible_keeps_no_per_layer_activations() -> None:
    """Bytes alive after forward (what backward will use): growth per layer, 2 -> 6 layers."""
    growth = {
        r: (_kept_after_forward(r, 6) - _kept_after_forward(r, 2)) / 4 for r in RESIDUALS.names()
    }
    one_activation = 256 * 64 * 4
    assert growth["standard"] > 10 * one_activation
    # checkpoint keeps each layer's input (one activation), reversible only two RNG states per layer
    assert growth["checkpoint"] == pytest.approx(one_activation, rel=0.2)
    rng_state = torch.get_rng_state().numel()  # bytes of one recorded CPU RNG state
    assert growth["reversible"] <= 2 * rng_state < 0.2 * one_activation


def test_reversible_without_recompute_is_the_same_network() -> None:
    """The recomputing Function (it runs where gradients are wanted) and the plain two-stream
    loop compute the same outputs, and both the formula by hand."""
    stack = _stack("reversible", 2)
    assert isinstance(stack, ReversibleResidual) and stack.recompute
    x = torch.randn(2, 9, 64, requires_grad=True)
    expected = stack(x)  # with grad: through the recomputing Function (the two streams joined)
    streams = [f[0] for f in expected.grad_fn.next_functions if f[0] is not None]
    assert any("Reversible" in type(f).__name__ for f in streams), streams
    stack.recompute = False
    torch.testing.assert_close(stack(x), expected)
    # the two-stream formula, by hand
    y1 = y2 = x
    for layer in stack.layers:
        y1 = y1 + layer.f(y2, None)
        y2 = y2 + layer.g(y1)
    torch.testing.assert_close(expected, torch.cat([y1, y2], dim=-1))


def test_reversible_recomputes_under_the_forward_autocast() -> None:
    stack = _stack("reversible", 2)
    seen: list[torch.dtype] = []
    ffn = stack.layers[0].g.fn.dense
    ffn.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    x = torch.randn(1, 16, 64, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = stack(x)
    out.float().sum().backward()  # outside autocast, as training loops do
    assert seen == [torch.bfloat16, torch.bfloat16]  # forward, then the recomputation
    assert torch.isfinite(x.grad).all()


def test_reversible_refuses_second_order_gradients() -> None:
    """Its backward recomputes by hand, one derivative deep: create_graph=True is refused in one
    line, never a second-order term silently missing; the standard residual computes it."""
    x = torch.randn(1, 8, 64, requires_grad=True)
    (grad,) = torch.autograd.grad(_stack("standard", 1)(x).square().sum(), x, create_graph=True)
    assert grad.requires_grad
    with pytest.raises(UnavailableError, match=r"reversible residual .*residual='standard'"):
        torch.autograd.grad(_stack("reversible", 1)(x).square().sum(), x, create_graph=True)


def test_same_weights_load_into_every_residual_variant() -> None:
    keys = {r: sorted(_stack(r, 2).state_dict()) for r in RESIDUALS.names()}
    assert keys["standard"] == keys["checkpoint"] == keys["reversible"]
    assert math.prod(len(k) for k in keys.values()) > 0
