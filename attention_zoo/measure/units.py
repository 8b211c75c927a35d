"""Units in and out: sizes as users write them, and seconds, bytes, FLOPs and rates as tables show
them."""

from __future__ import annotations

import math
import re

_UNITS = {
    "": 2**30,
    "b": 1,
    "k": 1e3,
    "kb": 1e3,
    "kib": 2**10,
    "m": 1e6,
    "mb": 1e6,
    "mib": 2**20,
    "g": 1e9,
    "gb": 1e9,
    "gib": 2**30,
    "t": 1e12,
    "tb": 1e12,
    "tib": 2**40,
}


def parse_bytes(text: str | float) -> int:
    """'8GB' -> 8e9, '8GiB' -> 8 * 2**30, '512MiB', '1.5G'; a bare number means GiB."""
    if isinstance(text, (int, float)):
        return int(text * 2**30)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read {text!r} as a size; write e.g. 8GiB, 8GB, 512MiB or 8 (GiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def format_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}" if unit == "GiB" else f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def format_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.2f} s"
    return f"{s * 1e3:.1f} ms" if s >= 1e-3 else f"{s * 1e6:.0f} us"


def format_gflop(n: float | None) -> str:
    return "-" if n is None else f"{n / 1e9:.2f}"


def format_number(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def significant(value: float, digits: int = 3) -> str:
    """`value` to `digits` significant digits, thousands separated, never in exponent form."""
    if value == 0 or not math.isfinite(value):
        return f"{value}"
    if abs(value) >= 10 ** (digits - 1) - 0.5:
        return f"{value:,.0f}"
    decimals = digits - 1 - math.floor(math.log10(abs(value)))
    return f"{value:,.{max(decimals, 0)}f}"


def format_tflops(flops_per_s: float | None) -> str:
    """A FLOP rate in TFLOP/s, three significant digits."""
    return "-" if flops_per_s is None else significant(flops_per_s / 1e12)


def format_percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{100 * fraction:.1f}%"
