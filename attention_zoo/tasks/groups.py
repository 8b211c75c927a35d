"""Finite groups as permutations, for word problems: the elements of Z_n, S_n and A_n, their
multiplication table, and the running product of a word computed by a parallel prefix scan.

Elements are permutation tuples of 0..n-1 in lexicographic order (jopetty/word-problem indexes
elements by their position in the group's element list). The product a · b applies a, then b:
(a · b)[i] = b[a[i]]. Z_n is the rotations i -> i + k, so its element k is the integer k mod n.
"""

from __future__ import annotations

import functools
import itertools
import re

import torch
from torch import Tensor

from ..errors import ConfigError

MAX_DEGREE = 6  # S6 has 720 elements, one token each; larger groups make a vocabulary too big
GROUP_NAMES = "parity (= Z2), Z<n> for n >= 2, S<n> or A<n> for 3 <= n <= 6"


def _parity(p: tuple[int, ...]) -> int:
    """0 for an even permutation, 1 for an odd one (by counting inversions)."""
    return sum(p[i] > p[j] for i in range(len(p)) for j in range(i + 1, len(p))) % 2


@functools.cache
def group_elements(name: str) -> tuple[tuple[int, ...], ...]:
    """The elements of group `name` as permutation tuples, identity first."""
    match = re.fullmatch(r"([ZSA])(\d+)", "Z2" if name == "parity" else name)
    if match is None:
        raise ConfigError(f"unknown group {name!r}; use {GROUP_NAMES}")
    kind, n = match.group(1), int(match.group(2))
    if kind == "Z" and n >= 2:
        return tuple(tuple((i + k) % n for i in range(n)) for k in range(n))
    if kind in "SA" and 3 <= n <= MAX_DEGREE:
        perms = itertools.permutations(range(n))
        return tuple(p for p in perms if kind == "S" or _parity(p) == 0)
    raise ConfigError(f"group {name!r} is out of range; use {GROUP_NAMES}")


def compose(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """a · b: apply a, then b."""
    return tuple(b[a[i]] for i in range(len(a)))


@functools.cache
def multiplication_table(name: str) -> Tensor:
    """(k, k) long: table[i, j] = index of element_i · element_j."""
    elements = group_elements(name)
    index = {p: i for i, p in enumerate(elements)}
    return torch.tensor([[index[compose(a, b)] for b in elements] for a in elements])


def prefix_products(tokens: Tensor, table: Tensor) -> Tensor:
    """(b, n) element indices -> (b, n): out[:, t] = tokens[:, 0] · ... · tokens[:, t].

    Hillis-Steele scan: log2(n) table look-ups over the whole batch, the earlier segment always
    on the left, as the product is associative but not commutative.
    """
    out = tokens.clone()
    shift = 1
    while shift < out.shape[1]:
        out[:, shift:] = table[out[:, :-shift], out[:, shift:]]
        shift *= 2
    return out
