"""FlexAttention as the cores call it: block masks from a pattern's candidate key tiles, and one
call that runs compiled on CUDA, PyTorch's eager (dense) FlexAttention elsewhere.

A pattern gives, per query tile of TILE positions, a fixed number of candidate key tiles (a
superset of those holding an allowed pair, from its structure: never an n x n mask of positions;
FlexAttention's own index lists are (tiles x tiles), n^2 / TILE^2 integers). The mask_mod is
evaluated inside the candidate tiles only, once per (pattern, length, device): tiles with no
allowed pair are dropped, tiles where every pair is allowed become "full" (no mask_mod inside the
kernel). Compiled on CUDA, flex_attention skips every other tile; eagerly (CPU, FakeTensors) it
computes densely under the same mask_mod, which is what the CPU tests check.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake

from ..dispatch import Call, compile_reason
from .compiled import maybe_compiled
from .masks import MaskMod

try:  # FlexAttention with AuxRequest (its log-sum-exp request): recent torch only
    from torch._higher_order_ops.flex_attention import flex_attention as flex_hop
    from torch.nn.attention.flex_attention import (
        AuxRequest,
        BlockMask,
        _apply_kernel_options,
        _identity,
        flex_attention,
    )

    _IMPORT_ERROR = None
except ImportError as exc:  # an older torch: the flex implementations say so, nothing else runs it
    _IMPORT_ERROR = f"{type(exc).__name__}: {exc}"
    BlockMask = Any  # for annotations only

TILE = 128  # positions per query and key tile (flex_attention's default block size)
# Scratch of one pass of the tile evaluation: candidate tiles x TILE^2 mask values
EVAL_BYTES = 64 << 20

# (b, h, q_idx, kv_idx) -> bool, FlexAttention's mask_mod signature
FlexMaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


def flex_environment(device: str) -> str | None:
    """Why FlexAttention cannot run on `device` with this installation, or None."""
    if _IMPORT_ERROR is not None:
        return f"needs FlexAttention with AuxRequest, which torch {torch.__version__} lacks"
    return compile_reason(device)


def flex_dtype(core: object, call: Call) -> str | None:
    """FlexAttention's compiled CUDA kernels take 16- and 32-bit floats."""
    if call.device == "cuda" and call.dtype == torch.float64:
        return "takes float16, bfloat16, float32 on CUDA, not float64"
    return None


def tiles(n: int) -> int:
    return -(-n // TILE)


@dataclass(frozen=True)
class TileMasks:
    """A pattern's block masks at one length: with full tiles, and with every tile partial (for
    calls with a key padding mask, where a full tile may hold padding)."""

    with_full: BlockMask
    all_partial: BlockMask

    def for_call(self, key_padding_mask: Tensor | None) -> BlockMask:
        """The block mask of one call: the pattern's, padding keys masked through the mask_mod."""
        if key_padding_mask is None:
            return self.with_full
        mod = self.all_partial.mask_mod
        real = key_padding_mask

        def padded(b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
            return mod(b, h, i, j) & real[b, j]

        block_mask = copy.copy(self.all_partial)  # shares the tile lists
        block_mask.mask_mod = padded
        return block_mask


def flex_mod(mod: MaskMod, n: int) -> FlexMaskMod:
    """A pattern's (query, key) mask_mod as FlexAttention's (b, h, q, kv), keys beyond n masked."""

    def flex(b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        return mod(i, j) & (j < n)

    return flex


def tile_masks(mod: MaskMod, n: int, candidates: Tensor | None, device: torch.device) -> TileMasks:
    """Block masks of pattern `mod` at length n from candidate key tiles (nq, K) (-1 = none;
    None: every tile), refined by evaluating the mask inside each candidate tile."""
    nq = tiles(n)
    if candidates is None:  # every tile once: no repeats to drop
        candidates = torch.arange(nq, device=device).expand(nq, nq)
        unique = torch.ones(nq, nq, dtype=torch.bool, device=device)
    else:
        candidates = candidates.to(device)
        unique = ~_repeats(candidates)
    some, every = _evaluate(mod, n, candidates)
    used = some & (candidates >= 0) & unique
    full = used & every
    fmod = flex_mod(mod, n)
    return TileMasks(
        with_full=_block_mask(candidates, used & ~full, full, n, fmod),
        all_partial=_block_mask(candidates, used, None, n, fmod),
    )


def chunk_window_tiles(
    n: int, chunk: int, before: int, after: int, causal: bool, device: torch.device | str
) -> Tensor:
    """(query tiles, K) key tiles holding every key of chunk windows over n positions: a query
    sees its chunk, `before` chunks back and `after` ahead (causal: none ahead, up to itself)."""
    nq = tiles(n)
    i = torch.arange(nq, device=device)
    after = 0 if causal else after
    first = ((i * TILE) // chunk - before).clamp(min=0) * chunk // TILE
    last = ((((i + 1) * TILE - 1) // chunk + after + 1) * chunk - 1) // TILE
    last = torch.minimum(last, i) if causal else last.clamp(max=nq - 1)
    # a tile spans at most (TILE - 1) // chunk + 2 chunks: with the neighbours, a span of keys
    # that at most ceil(span / TILE) + 1 tiles hold
    width = -(-((TILE - 1) // chunk + 2 + before + after) * chunk // TILE) + 1
    slots = first[:, None] + torch.arange(width, device=device)
    return torch.where(slots <= last[:, None], slots, -1)


def structural_block_mask(candidates: Tensor, n: int) -> BlockMask:
    """A block mask whose tiles are the candidates, every one partial: for a mask_mod that
    depends on each call's data (given to a copy per call)."""
    used = (candidates >= 0) & ~_repeats(candidates)
    return _block_mask(candidates, used, None, n, lambda b, h, i, j: j < n)


def _repeats(candidates: Tensor) -> Tensor:
    """(nq, K) bool: slots that repeat an earlier slot's tile."""
    same = candidates[:, :, None] == candidates[:, None, :]
    k = candidates.shape[1]
    earlier = torch.ones(k, k, dtype=torch.bool, device=candidates.device).tril(-1)
    return (same & earlier).any(-1)


def _evaluate(mod: MaskMod, n: int, candidates: Tensor) -> tuple[Tensor, Tensor]:
    """(any allowed pair, every pair allowed) per candidate tile (nq, K), query tiles a pass at a
    time; positions beyond n count as not allowed (keys) and as allowing anything (queries)."""
    nq, k = candidates.shape
    t = torch.arange(TILE, device=candidates.device)
    some, every = [], []
    step = max(1, EVAL_BYTES // (k * TILE * TILE))
    for s in range(0, nq, step):  # a few passes at most, each vectorised: bounds the scratch
        e = min(s + step, nq)
        q = (torch.arange(s, e, device=t.device)[:, None] * TILE + t)[:, None, :, None]
        kv = (candidates[s:e].clamp(min=0)[:, :, None] * TILE + t)[:, :, None, :]
        ok = mod(q, kv) & (kv < n)  # (e - s, K, TILE, TILE)
        some.append(ok.flatten(2).any(-1))
        every.append((ok | (q >= n)).flatten(2).all(-1))
    return torch.cat(some), torch.cat(every)


def _block_mask(
    candidates: Tensor, partial: Tensor, full: Tensor | None, n: int, mod: FlexMaskMod
) -> BlockMask:
    nq = candidates.shape[0]

    def ordered(keep: Tensor) -> tuple[Tensor, Tensor]:
        """(count (nq,), indices (nq, nq): the kept tiles first, ascending)."""
        dense = torch.zeros(nq, nq + 1, dtype=torch.bool, device=candidates.device)
        dense.scatter_(1, torch.where(keep, candidates, nq), True)
        dense = dense[:, :nq]
        idx = dense.to(torch.int8).argsort(dim=-1, descending=True, stable=True)
        return dense.sum(-1).to(torch.int32)[None, None], idx.to(torch.int32)[None, None]

    counts, idx = ordered(partial)
    full_counts, full_idx = ordered(full) if full is not None else (None, None)
    return BlockMask.from_kv_blocks(
        counts, idx, full_counts, full_idx, BLOCK_SIZE=TILE, mask_mod=mod, seq_lengths=(n, n)
    )


def run_flex(
    q: Tensor, k: Tensor, v: Tensor, block_mask: BlockMask, *, scale: float, lse: bool = False
) -> tuple[Tensor, Tensor | None]:
    """(out (b, h, n, d), with `lse` the log-sum-exp (b, h, n) in natural log, -inf where a query
    sees no key). CUDA: the compiled kernel; inside a torch.compile region: traced; CPU and
    FakeTensors: the eager implementation (dense on the CPU, forward and backward)."""
    if torch.compiler.is_compiling() or (q.device.type == "cuda" and not is_fake(q)):
        aux = AuxRequest(lse=True) if lse else None
        grouped = k.shape[1] != q.shape[1]  # shared KV heads (the eager operator reads them as is)
        result = maybe_compiled(
            flex_attention,
            q,
            k,
            v,
            block_mask=block_mask,
            scale=scale,
            return_aux=aux,
            enable_gqa=grouped,
        )
        return (result[0], result[1].lse) if lse else (result, None)
    # PyTorch's front end refuses CPU backward (its compiled CPU kernel has none); the operator's
    # eager implementation computes densely, with autograd, on any device
    options = _apply_kernel_options(q, k, v, lse, None, None)
    out, logsumexp, *_ = flex_hop(q, k, v, _identity, block_mask.as_tuple(), scale, options)
    return out, logsumexp * math.log(2) if lse else None  # the operator's is in base 2
