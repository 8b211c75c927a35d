"""What a task's models cost: one bench case per trained model configuration (target `model`, mode
`train-step`, the task's length and batch), so the report can set accuracy beside cost."""

from __future__ import annotations

from collections.abc import Iterable

from ..measure.cases import BenchCase
from .runner import RunSpec


def cost_cases(runs: Iterable[RunSpec], device: str = "cpu") -> list[BenchCase]:
    """One train-step case per distinct model of `runs` (seeds share a model configuration)."""
    cases: dict[str, BenchCase] = {}
    for spec in runs:
        fields = spec.model_fields()
        hidden, heads = fields["hidden_size"], fields["num_attention_heads"]
        case = BenchCase(
            target="model",
            backend="+".join(spec.variant.attn_layers),
            seq_len=spec.preset.task.seq_len,
            batch=spec.preset.train.batch_size,
            num_heads=heads,
            head_dim=fields.get("attention_head_size") or hidden // heads,
            hidden=hidden,
            causal=fields["is_decoder"],
            device=device,
            mode="train-step",
            model=fields,
            label=spec.variant.label,
        )
        cases.setdefault(case.key(), case)
    return list(cases.values())
