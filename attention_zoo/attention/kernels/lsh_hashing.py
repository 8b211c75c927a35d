"""LSH bucketing: bucket counts, angular hashing of shared query/keys, sorting by bucket.

Angular LSH (Andoni et al. 2015): a vector's bucket is the argmax of [xR; -xR] for a random
rotation R; a factorised count (a, b, ...) hashes once per factor and combines the factors' buckets
(a * b * ... buckets from rotations of (a + b + ...) / 2 columns).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...errors import OptionError

Buckets = int | tuple[int, ...]


def validate_buckets(value: object) -> Buckets | None:
    """None, a positive int (even unless 1) or a pair of positive even ints; lists become tuples."""
    what = (
        "lsh num_buckets must be None (automatic), a positive even int (or 1), or a pair (a, b) of "
        "positive even ints giving a*b buckets"
    )
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1 or (value > 1 and value % 2):
            raise OptionError(f"{what}; got {value!r}" + (" (odd)" if value > 1 else ""))
        return value
    if isinstance(value, (tuple, list)):
        ok = len(value) == 2 and all(
            isinstance(f, int) and not isinstance(f, bool) and f >= 2 and f % 2 == 0 for f in value
        )
        if not ok:
            raise OptionError(f"{what}; got the factorised value {value!r}")
        return (int(value[0]), int(value[1]))
    raise OptionError(f"{what}; got {type(value).__name__} {value!r}")


def auto_buckets(npad: int, chunk: int) -> Buckets:
    """HF's rule on the padded length: ~2 * npad / chunk rounded down to a power of two, factorised
    into two powers of two when above 2 * max(sqrt(npad / chunk), chunk) (keeps rotations small)."""
    p = (2 * (npad // chunk)).bit_length() - 1
    limit = 2 * max(int((npad // chunk) ** 0.5), chunk)
    if 2**p > limit:
        return (2 ** (p // 2), 2 ** (p - p // 2))
    return 2**p


def total_buckets(nb: Buckets) -> int:
    return nb if isinstance(nb, int) else nb[0] * nb[1]


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
    """x (b, h, n, d), rot (h, d, g, k) -> buckets (b, h, g, n): argmax([xR; -xR]) per round."""
    h, d, g, k = rot.shape
    rotated = torch.matmul(x, rot.reshape(h, d, g * k)).unflatten(-1, (g, k))  # (b, h, n, g, k)
    if isinstance(nb, int):
        buckets = argmax_pm(rotated)
    else:  # factorised: two independent hashes a and b combine into a * b buckets
        a = nb[0] // 2
        buckets = argmax_pm(rotated[..., :a]) + nb[0] * argmax_pm(rotated[..., a:])
    return buckets.transpose(-1, -2)
