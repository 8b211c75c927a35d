"""The base of the measuring dispatch modes (storage tracker, FLOP counter, meta memo)."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode


class UncompiledMode(TorchDispatchMode):
    """A dispatch mode nothing compiles. torch wraps a mode's __torch_dispatch__ in
    torch._disable_dynamo, whose first call imports torch._dynamo (seconds); this one need not."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False
