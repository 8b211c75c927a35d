"""Which implementation each attention core of a built case runs: what results store beside the
numbers, so a table says that `local` ran FlexAttention on the GPU and PyTorch's CPU op here."""

from __future__ import annotations

import torch

from ..attention.base import AttentionCore
from ..attention.dispatch import Call
from .cases import DTYPES, BenchCase


def kernel_names(case: BenchCase, module: torch.nn.Module | None) -> dict[str, str]:
    """{backend: implementation} for every registered core in `module` that the case runs (not
    the inner cores a core says it leaves idle), as the pick rule chooses for the case's device,
    dtype, length and head size (several layers of one backend that pick differently are joined
    with '+'); a decode case's own decoding: "step"."""
    if module is None:
        return {}
    if case.mode == "decode" and case.decoder == "own":  # each token: the core's decoding step
        return {type(core).spec.name: "step" for core in attention_cores(module)}
    found: dict[str, list[str]] = {}
    cores = attention_cores(module)
    idle = idle_ids(case, cores)
    for core in cores:
        if id(core) in idle:  # an inner core this step does not run
            continue
        names = found.setdefault(type(core).spec.name, [])
        name = core.pick(case_call(case, core)).name
        if name not in names:
            names.append(name)
    return {backend: "+".join(names) for backend, names in found.items()}


def idle_ids(case: BenchCase, cores: list[AttentionCore]) -> set[int]:
    """The ids of the inner cores that `cores` leave idle in the case's step (a core that
    computes their part itself, as nsa's tiles take its window on long inputs)."""
    rows = case.batch * case.attention_shape()[0]
    return {id(c) for core in cores for c in core.idle_cores(case_call(case, core), rows)}


def case_call(case: BenchCase, core: AttentionCore) -> Call:
    """The call `case` makes of `core`: its device, dtype, length, head size, dropout and query
    heads per key/value head."""
    device = torch.device(case.device).type
    heads, head_dim = case.attention_shape()
    group = heads // core.layout.kv_heads_for(heads)
    dropout = bool(core.dropout_p)
    return Call(device, DTYPES[case.dtype], case.seq_len, head_dim, dropout, group=group)


def attention_cores(module: torch.nn.Module) -> list[AttentionCore]:
    """The registered attention cores inside `module`."""
    return [
        m for m in module.modules() if isinstance(m, AttentionCore) and hasattr(type(m), "spec")
    ]
