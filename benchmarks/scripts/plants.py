"""Planted regressions of the `local` core for testing the gate: source appended to
attention_zoo/attention/local.py in a scratch clone (tests/test_gate.py, acceptance.py), never in a
checkout anyone works in."""

from __future__ import annotations

from pathlib import Path

LOCAL = Path("attention_zoo") / "attention" / "local.py"


def slower(factor: float) -> str:
    """Every call of the local core's kernel takes `factor` times as long, busy all along (CPU
    work, as a slower kernel's is; on CUDA the call is timed to the GPU's end, then the host
    stays busy for the rest)."""
    return f"""

import time as _time

_plain_attend = LocalAttention.attend


def _slower_attend(self, q, k, v, key_padding_mask):
    if q.is_cuda:
        torch.cuda.synchronize(q.device)
    start = _time.perf_counter()
    out = _plain_attend(self, q, k, v, key_padding_mask)
    if q.is_cuda:
        torch.cuda.synchronize(q.device)
    until = _time.perf_counter() + {factor - 1!r} * (_time.perf_counter() - start)
    while _time.perf_counter() < until:  # planted: {factor}x as long, busy all along
        pass
    return out


LocalAttention.attend = _slower_attend
"""


def hungrier(extra_bytes: int) -> str:
    """Every call of the local core keeps `extra_bytes` more alive from the start of its forward
    to the end of its backward."""
    return f"""

class _Kept(torch.autograd.Function):
    # planted: a buffer alive from the start of the forward to the end of the backward

    @staticmethod
    def forward(ctx, q, kept):
        ctx.kept = kept
        return q.view_as(q)

    @staticmethod
    def backward(ctx, grad):
        del ctx.kept
        return grad, None


_plain_attend = LocalAttention.attend


def _hungrier_attend(self, q, k, v, key_padding_mask):
    kept = torch.empty({extra_bytes} // 4, dtype=torch.float32, device=q.device)
    return _plain_attend(self, _Kept.apply(q, kept), k, v, key_padding_mask)


LocalAttention.attend = _hungrier_attend
"""


def head_only_backend(name: str) -> str:
    """A backend registered on this commit only: a copy of `local` under `name`."""
    return f"""


_PLANTED_CAPS = Capabilities(exact=False, fixed_pattern=True)


@register_attention({name!r}, config=LocalConfig, caps=_PLANTED_CAPS)
class _PlantedAttention(LocalAttention):
    \"\"\"Planted: a copy of local that exists on this commit only.\"\"\"
"""


def plant(repo: Path, source: str) -> None:
    """Append `source` to the local core's module of the clone at `repo`."""
    path = repo / LOCAL
    path.write_text(path.read_text() + source)
