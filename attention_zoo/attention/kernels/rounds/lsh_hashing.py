"""LSH bucketing: bucket counts, angular hashing of shared query/keys, sorting by bucket.

Angular LSH (Andoni et al. 2015): a vector's bucket is the argmax of [xR; -xR] for a random
rotation R; a factorised count (a, b, ...) hashes once per factor and combines the factors' buckets
(a * b * ... buckets from rotations of (a + b + ...) / 2 columns).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ....errors import OptionError

Buckets = int | tuple[int, ...]


def validate_buckets(value: object) -> Buckets | None:
    """None, a positive int (even unless 1) or a sequence of positive even ints (factors, as HF's
    list: their product is the bucket count); lists become tuples."""
    what = (
        "lsh num_buckets must be None (automatic), a positive even int (or 1), or a list of "
        "positive even factors (a, b, ...) giving a*b*... buckets"
    )
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1 or (value > 1 and value % 2):
            raise OptionError(f"{what}; got {value!r}" + (" (odd)" if value > 1 else ""))
        return value
    if isinstance(value, (tuple, list)):
        ok = len(value) >= 1 and all(
            isinstance(f, int) and not isinstance(f, bool) and f >= 2 and f % 2 == 0 for f in value
        )
        if not ok:
            raise OptionError(f"{what}; got the factorised value {value!r}")
        return tuple(int(f) for f in value)
    raise OptionError(f"{what}; got {type(value).__name__} {value!r}")


def auto_buckets(length: int, chunk: int, max_length: int | None = None) -> Buckets:
    """HF's `_set_num_buckets`: ~2 * length / chunk rounded down to a power of two, factorised
    into two powers of two when above 2 * max(sqrt(max_length / chunk), chunk) (keeps rotations
    small); HF takes max_length from max_position_embeddings (default: length)."""
    limit_length = length if max_length is None else max_length
    p = max((2 * (length // chunk)).bit_length() - 1, 0)  # shorter than a chunk: one bucket
    limit = 2 * max(int((limit_length // chunk) ** 0.5), chunk)
    if 2**p > limit:
        return (2 ** (p // 2), 2 ** (p - p // 2))
    return 2**p


def factors(nb: Buckets) -> tuple[int, ...]:
    """The hash factors of a bucket count: one hash for an int, one per factor for a list."""
    return (nb,) if isinstance(nb, int) else nb


def total_buckets(nb: Buckets) -> int:
    return math.prod(factors(nb))


def rotation_width(nb: Buckets) -> int:
    """Columns of one round's random rotation: half the sum of the factors (HF's rotation_size)."""
    return sum(factors(nb)) // 2


def sort_by_bucket(buckets: Tensor) -> tuple[Tensor, Tensor]:
    """buckets (b, h, r, n) -> (perm, sorted buckets): order by (bucket, position) per round.

    Sorted buckets are int32: they are only compared, and every byte here is live while the
    fused kernel runs."""
    npad = buckets.shape[-1]
    keys = buckets.mul_(npad).add_(torch.arange(npad, device=buckets.device))
    sorted_keys, perm = torch.sort(keys, dim=-1)
    del keys
    return perm, torch.div(sorted_keys, npad, rounding_mode="floor").to(torch.int32)


def round_groups(r: int, per_pass: int | None) -> list[tuple[int, int]]:
    step = r if per_pass is None else per_pass
    return [(s, min(s + step, r)) for s in range(0, r, step)]


def argmax_pm(x: Tensor) -> Tensor:
    """argmax over [x, -x] along the last dim without materialising the concatenation."""
    mx, imx = x.max(dim=-1)
    mn, imn = x.min(dim=-1)
    return torch.where(mx >= -mn, imx, imn + x.shape[-1])


def hash_rounds(x: Tensor, rot: Tensor, nb: Buckets) -> Tensor:
    """x (b, h, n, d), rot (h, d, g, k) -> buckets (b, h, g, n): argmax([xR; -xR]) per round.

    Factorised counts hash once per factor f on its own f/2 rotation columns and combine the
    factors' buckets in mixed radix (bucket = b0 + f0 * (b1 + f1 * ...)), as HF does."""
    h, d, g, k = rot.shape
    rotated = torch.matmul(x, rot.reshape(h, d, g * k)).unflatten(-1, (g, k))  # (b, h, n, g, k)
    buckets, start, radix = None, 0, 1
    for f in factors(nb):  # the bucket factors: a handful at most
        part = argmax_pm(rotated[..., start : start + f // 2]) * radix
        buckets = part if buckets is None else buckets + part
        start, radix = start + f // 2, radix * f
    return buckets.transpose(-1, -2)
