"""Sigmoid attention's kernels: out = sigmoid(q k^T * scale + b) v, no normalisation (Ramapuram et
al. 2024). Without a row sum, key blocks add up with no online rescaling: the tiled kernel keeps
one (query chunk x key block) tile at a time, never the n x n map, forward or backward."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake
from torch.autograd import Function

from ..dispatch import expand_kv
from .backward import hand_written_backward
from .sums.plain import compute_dtype

KEY_BLOCK = 128  # keys per tile
TILE_BYTES = 2 << 20  # one tile's scores over every head: small enough to stay in cache


def key_counts(real: Tensor | None, n: int, *, causal: bool, device: torch.device) -> Tensor:
    """(b | 1, n) int: the keys each of n queries may see (causal: the real ones up to it; else
    every real one)."""
    if real is None:
        counts = torch.arange(1, n + 1, device=device) if causal else torch.full((n,), n)
        return counts.to(device)[None]
    real = real.to(torch.int64)
    return real.cumsum(-1) if causal else real.sum(-1, keepdim=True).expand(-1, n)


def paper_bias(counts: Tensor, dtype: torch.dtype) -> Tensor:
    """-log(n) per query, n the keys it may see (at least 1): the paper's bias, in `dtype`."""
    return counts.clamp(min=1).to(torch.float64).log().neg().to(dtype)


def sigmoid_reference(
    q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, bias: Tensor, *, scale: float
) -> Tensor:
    """sigmoid(q k^T * scale + bias) v over the allowed keys, materialised: q (b, h, t, d), k and
    v (b, kv, n, *), allowed broadcasting to (b, h, t, n), bias to (b, h, t)."""
    k, v = expand_kv(q, k), expand_kv(q, v)
    probs = torch.sigmoid(torch.matmul(q, k.transpose(-1, -2)) * scale + bias[..., None])
    if allowed is not None:
        probs = probs.masked_fill(~allowed, 0)
    return torch.matmul(probs, v)


def tiled_sigmoid(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    real: Tensor | None,
    bias: Tensor,
    *,
    scale: float,
    causal: bool,
) -> Tensor:
    """sigmoid_reference's output by tiles, padding keys (real: (b, n) bool) and later ones
    (causal) left out; bias (b | 1, n). 16-bit inputs are computed in float32."""
    dtype, wide = q.dtype, compute_dtype(q.dtype)
    q, k, v = (t.to(wide) for t in (q, k, v))
    return SigmoidTiles.apply(q, k, v, bias.to(wide), real, scale, causal).to(dtype)


class _Tiles:
    """q, k, v as the tiles read them: (b * kv) batches, each query chunk with the g query heads
    of its key head stacked (shared KV heads: one product per key head)."""

    def __init__(
        self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: float, causal: bool
    ) -> None:
        b, h, n, d = q.shape
        kv = k.shape[1]
        self.batches, self.group, self.n = b * kv, h // kv, n
        self.scale, self.causal = scale, causal
        self.q = q.reshape(self.batches, self.group, n, d)
        self.k = k.reshape(self.batches, n, d)
        self.v = v.reshape(self.batches, n, v.shape[-1])
        self.bias = bias[:, None].expand(b, h, n).reshape(self.batches, self.group, n)
        row = self.batches * self.group * KEY_BLOCK * q.element_size()  # one query's tile bytes
        self.chunk = max(1, TILE_BYTES // row // KEY_BLOCK) * KEY_BLOCK
        # shapes only (meta, FakeTensors: memory and FLOP predictions): a chunk's first tile
        # allocates what any other does, and the other tiles' products are only counted (see
        # `count_rest`), so thousands of tiles at long lengths need not run
        fake = q.device.type == "meta" or (not torch.compiler.is_compiling() and is_fake(q))
        self.tiles = 1 if fake else None

    def chunks(self) -> Iterator[tuple[int, int]]:
        for qs in range(0, self.n, self.chunk):
            yield qs, min(qs + self.chunk, self.n)

    def keys(self, qe: int) -> int:
        """How many keys a chunk ending at qe sees (causal: none after its last query)."""
        return qe if self.causal else self.n

    def blocks(self, qs: int, qe: int) -> Iterator[tuple[int, int]]:
        """Key blocks a query chunk sees (shapes only: the first)."""
        for s in range(0, self.keys(qe), KEY_BLOCK)[: self.tiles]:
            yield s, min(s + KEY_BLOCK, self.n)

    def count_rest(self, qc: Tensor, qe: int, widths: tuple[int, ...]) -> None:
        """Shapes only: the matmul work of the chunk's tiles that did not run, one (chunk x keys x
        width) product per width, on broadcast operands (a FLOP count sees them, a memory count
        only their small outputs)."""
        rest = self.keys(qe) - min(KEY_BLOCK, self.keys(qe))
        if self.tiles is None or rest <= 0:
            return
        zero = qc.new_zeros(())
        for width in widths:
            torch.bmm(zero.expand(*qc.shape[:2], rest), zero.expand(qc.shape[0], rest, width))

    def rows(self, x: Tensor, qs: int, qe: int) -> Tensor:
        """(batches, group, n, *) -> the chunk's (batches, group * chunk, *)."""
        return x[:, :, qs:qe].reshape(self.batches, -1, x.shape[-1])

    def probs(self, qc: Tensor, bc: Tensor, qs: int, qe: int, s: int, e: int) -> Tensor:
        """(batches, group * chunk, e - s): sigmoid of the tile's scores, later keys zeroed."""
        p = torch.baddbmm(bc, qc, self.k[:, s:e].transpose(1, 2), alpha=self.scale).sigmoid_()
        if self.causal and e - 1 > qs:  # the tile crosses the diagonal: key s + j, query qs + i
            rows = min(e, qe) - qs  # queries below the tile's last key see all of it
            later = torch.ones(rows, e - s, dtype=torch.bool, device=p.device).triu_(qs - s + 1)
            p.view(self.batches, self.group, qe - qs, e - s)[:, :, :rows].masked_fill_(later, 0)
        return p


class SigmoidTiles(Function):
    """Sigmoid attention by tiles; the backward recomputes each tile's probabilities p and uses
    sigmoid' = p (1 - p): saved are only the inputs."""

    @staticmethod
    def forward(ctx, q, k, v, bias, real, scale, causal):  # type: ignore[override]
        ctx.save_for_backward(q, k, v, bias, real)
        ctx.scale, ctx.causal = scale, causal
        tiles = _Tiles(q, k, _masked(v, real), bias, scale, causal)
        out = q.new_empty(*tiles.q.shape[:3], v.shape[-1])
        for qs, qe in tiles.chunks():
            qc, bc = tiles.rows(tiles.q, qs, qe), tiles.rows(tiles.bias[..., None], qs, qe)
            acc = qc.new_zeros(*qc.shape[:2], v.shape[-1])
            for s, e in tiles.blocks(qs, qe):
                acc.baddbmm_(tiles.probs(qc, bc, qs, qe, s, e), tiles.v[:, s:e])
            tiles.count_rest(qc, qe, (q.shape[-1], v.shape[-1]))  # scores, weights x values
            out[:, :, qs:qe] = acc.view(*out.shape[:2], qe - qs, -1)
        return out.view(*q.shape[:3], v.shape[-1])

    @staticmethod
    @hand_written_backward
    def backward(ctx, grad):  # type: ignore[override]
        q, k, v, bias, real = ctx.saved_tensors
        tiles = _Tiles(q, k, _masked(v, real), bias, ctx.scale, ctx.causal)
        g = grad.contiguous().view(*tiles.q.shape[:3], v.shape[-1])  # a sum's is broadcast
        dq = torch.empty_like(tiles.q)
        dk, dv = torch.zeros_like(tiles.k), torch.zeros_like(tiles.v)
        for qs, qe in tiles.chunks():
            qc, bc = tiles.rows(tiles.q, qs, qe), tiles.rows(tiles.bias[..., None], qs, qe)
            gc = tiles.rows(g, qs, qe)
            dqc = torch.zeros_like(qc)
            for s, e in tiles.blocks(qs, qe):
                p = tiles.probs(qc, bc, qs, qe, s, e)
                dv[:, s:e].baddbmm_(p.transpose(1, 2), gc)
                dp = torch.bmm(gc, tiles.v[:, s:e].transpose(1, 2))
                ds = torch.ops.aten.sigmoid_backward.grad_input(dp, p, grad_input=dp)
                dqc.baddbmm_(ds, tiles.k[:, s:e], alpha=ctx.scale)
                dk[:, s:e].baddbmm_(ds.transpose(1, 2), qc, alpha=ctx.scale)
                del p, dp, ds  # before the next tile's: one tile's scratch at a time
            d, dv_width = q.shape[-1], v.shape[-1]  # scores, dv, dp, dq, dk
            tiles.count_rest(qc, qe, (d, dv_width, dv_width, d, d))
            dq[:, :, qs:qe] = dqc.view(*dq.shape[:2], qe - qs, -1)
        dv = _masked(dv.view_as(v), real)  # a padding key's value never reaches an output
        return dq.view_as(q), dk.view_as(k), dv, None, None, None, None


def _masked(v: Tensor, real: Tensor | None) -> Tensor:
    """v (b, kv, n, *) with padding keys' rows zeroed: they add nothing to any output."""
    return v if real is None else v * real[:, None, :, None]
