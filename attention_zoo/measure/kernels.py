"""Which implementation each attention core of a built case runs: what results store beside the
numbers, so a table says that `local` ran FlexAttention on the GPU and PyTorch's CPU op here."""

from __future__ import annotations

import torch

from ..attention.base import AttentionCore
from ..attention.kernels.dispatch import Call
from .cases import DTYPES, BenchCase


def kernel_names(case: BenchCase, module: torch.nn.Module | None) -> dict[str, str]:
    """{backend: implementation} for every registered core in `module`, as the pick rule
    chooses for the case's device, dtype, length and head size (several layers of one backend
    that pick differently are joined with '+')."""
    if module is None:
        return {}
    found: dict[str, list[str]] = {}
    for core in module.modules():
        if not isinstance(core, AttentionCore) or not hasattr(type(core), "spec"):
            continue
        call = Call(
            torch.device(case.device).type,
            DTYPES[case.dtype],
            case.seq_len,
            case.head_dim,
            bool(core.dropout_p),
        )
        names = found.setdefault(type(core).spec.name, [])
        name = core.pick(call).name
        if name not in names:
            names.append(name)
    return {backend: "+".join(names) for backend, names in found.items()}
