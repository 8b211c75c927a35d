"""The experiments behind the Reformer's published claims (judged in claims.py), and their runs.

Three sizes. `paper`: the published settings (google/reformer-enwik8-shaped models, batch 8,
n up to 16384, BERT-base-shaped layers for residuals): measured on CUDA, predicted on the meta
device elsewhere. `cpu` (default): the same comparisons scaled to 2 CPU cores in minutes, keeping
each claim's ratio structure (which feature is compared with which, d_ff/hidden and head ratios),
measured with the profiler. `smoke`: the same pipeline at toy sizes (CI). Claims d (parameter
counts, memory) and e (the 0.5M-token step, predicted) use the crime-and-punishment config at
every size but smoke. Every case is labelled `reformer/<size>/<claim>/<role>`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import torch

from ...config import ReformerConfig
from ...measure.cases import BenchCase
from ...measure.metrics import metric_row
from ...measure.runner import MeasureSettings
from ...model import ReformerModel
from ...presets import load_sweep_preset
from ...store import ResultStore
from ...sweep import SweepResult, default_memory_limit, run_sweep
from ..base import SIZES, RunOptions

PREFIX = "reformer"
KIND = "reproduce"  # the store run of claim d's parameter counts


@dataclass(frozen=True, kw_only=True)
class Experiment:
    """The cases of one claim, and the metric groups they need (prediction only, or measured)."""

    claim: str
    cases: tuple[BenchCase, ...]
    predicted_only: bool = False  # the meta-device prediction is the result (no allocation)


@dataclass(frozen=True, kw_only=True)
class Sizes:
    """The settings of one size: models, lengths, batches (ReformerConfig field dicts)."""

    attention_model: dict[str, Any]  # claim a: the local+lsh model; global swaps attn_layers
    attention_lengths: tuple[int, ...]
    ffn_model: dict[str, Any]  # claim b: the default config...
    ffn_wide: dict[str, Any]  # ...and its changes: fewer heads, a wide FFN
    ffn_lengths: tuple[int, ...]
    ffn_batch: int
    ffn_chunk: int  # positions per FFN slice when chunked
    residual_model: dict[str, Any]  # claim c: one model, standard vs reversible residuals
    residual_layers: tuple[int, ...]
    residual_length: int
    residual_batch: int
    axial_length: int  # claim d: inference length and batch of the memory comparison
    axial_batch: int
    step_length: int | None  # claim e: train-step length (None: the config's 524,288)
    note: str


def _enwik8_shaped(**changes: Any) -> dict[str, Any]:
    """google/reformer-enwik8's shape (12 layers alternating local/lsh, hidden 1024, 8 heads of
    128, d_ff 4096, 4 hashes); chunk lengths are our defaults (64)."""
    return {
        "vocab_size": 258,
        "hidden_size": 1024,
        "num_attention_heads": 8,
        "attention_head_size": 128,
        "num_hidden_layers": 12,
        "attn_layers": ["local", "lsh"],
        "feed_forward_size": 4096,
        "num_hashes": 4,
        "is_decoder": True,
        "hidden_dropout_prob": 0.0,
        **changes,
    }


def _small(**changes: Any) -> dict[str, Any]:
    """The CPU-scale model: the enwik8 shape with 2 layers, hidden 256, 4 heads of 64 (d_ff/hidden
    and the local/lsh alternation kept)."""
    small = {
        "hidden_size": 256,
        "num_attention_heads": 4,
        "attention_head_size": 64,
        "num_hidden_layers": 2,
        "feed_forward_size": 1024,
    }
    return _enwik8_shaped(**{**small, **changes})


SETTINGS: dict[str, Sizes] = {
    "paper": Sizes(
        attention_model=_enwik8_shaped(),
        attention_lengths=(2048, 4096, 8192, 16384),
        ffn_model=_enwik8_shaped(),
        ffn_wide={"num_attention_heads": 2, "feed_forward_size": 16384},
        ffn_lengths=(1024, 2048, 4096),
        ffn_batch=8,
        ffn_chunk=64,
        residual_model={  # bert-base-uncased's shape, full attention; causal: measured as an LM
            "vocab_size": 30522,
            "hidden_size": 768,
            "num_attention_heads": 12,
            "attention_head_size": 64,
            "feed_forward_size": 3072,
            "attn_layers": ["full"],
            "hidden_act": "gelu",
            "is_decoder": True,
            "hidden_dropout_prob": 0.0,
        },
        residual_layers=(4, 8, 12),
        residual_length=512,
        residual_batch=8,
        axial_length=512,
        axial_batch=8,
        step_length=None,
        note="the blog's settings; FFN chunks of 64 positions (blog: 1; same saving)",
    ),
    "cpu": Sizes(
        attention_model=_small(),
        attention_lengths=(2048, 4096, 8192),
        ffn_model=_small(),
        ffn_wide={"num_attention_heads": 1, "feed_forward_size": 4096},  # heads / 4, d_ff x 4
        ffn_lengths=(512, 1024, 2048),
        ffn_batch=2,
        ffn_chunk=64,
        residual_model=_small(attn_layers=["full"]),
        residual_layers=(2, 4, 6),
        residual_length=512,
        residual_batch=2,
        axial_length=512,
        axial_batch=8,
        step_length=None,
        note="2-layer hidden-256 models, batch 2, lengths / 2 (claim a: as published)",
    ),
    "smoke": Sizes(
        attention_model=_small(
            hidden_size=64, num_attention_heads=2, attention_head_size=32, feed_forward_size=256
        ),
        attention_lengths=(256, 512),
        ffn_model=_small(
            hidden_size=64, num_attention_heads=4, attention_head_size=16, feed_forward_size=256
        ),
        ffn_wide={"num_attention_heads": 1, "feed_forward_size": 1024},
        ffn_lengths=(256, 512),
        ffn_batch=1,
        ffn_chunk=64,
        residual_model=_small(
            hidden_size=64,
            num_attention_heads=2,
            attention_head_size=32,
            feed_forward_size=256,
            attn_layers=["full"],
        ),
        residual_layers=(1, 3),
        residual_length=128,
        residual_batch=2,
        axial_length=128,
        axial_batch=1,
        step_length=2048,
        note="toy sizes: checks the pipeline, not the claims",
    ),
}


def crime_and_punishment() -> dict[str, Any]:
    """The crime-and-punishment ReformerConfig fields, from the built-in preset of that name."""
    model = dict(load_sweep_preset("crime-and-punishment").grid.models[0])
    model.pop("label", None)
    return model


def model_case(
    label: str,
    model: dict[str, Any],
    *,
    seq_len: int,
    batch: int = 1,
    mode: str = "forward",
    dtype: str = "float32",
    device: str = "cpu",
) -> BenchCase:
    """A ReformerLM case whose width, heads and causality come from `model`."""
    layers = model["attn_layers"]
    heads = model["num_attention_heads"]
    return BenchCase(
        target="model",
        backend="+".join(dict.fromkeys(layers)),
        seq_len=seq_len,
        batch=batch,
        num_heads=heads,
        head_dim=model.get("attention_head_size") or model["hidden_size"] // heads,
        hidden=model["hidden_size"],
        causal=model.get("is_decoder", False),
        dtype=dtype,
        device=device,
        mode=mode,
        model=model,
        label=label,
    )


def experiments(size: str, *, device: str = "cpu") -> list[Experiment]:
    """The cases of claims a-e at `size` (claim f is the duplication task, run separately)."""
    s = SETTINGS[size]

    def label(claim: str, role: str) -> str:
        return f"{PREFIX}/{size}/{claim}/{role}"

    a = [
        model_case(label("a", role), {**s.attention_model, **changes}, seq_len=n, device=device)
        for role, changes in (
            ("local+lsh", {}),
            ("full", {"attn_layers": ["full"]}),
            ("sdpa", {"attn_layers": ["sdpa"]}),
        )
        for n in s.attention_lengths
    ]
    b = [
        model_case(
            label("b", f"{config}-{'chunked' if chunk else 'unchunked'}"),
            {**s.ffn_model, **wide, "chunk_size_feed_forward": chunk},
            seq_len=n,
            batch=s.ffn_batch,
            device=device,
        )
        for config, wide in (("default", {}), ("wide", s.ffn_wide))
        for chunk in (0, s.ffn_chunk)
        for n in s.ffn_lengths
    ]
    c = [
        model_case(
            label("c", residual),
            {**s.residual_model, "residual": residual, "num_hidden_layers": layers},
            seq_len=s.residual_length,
            batch=s.residual_batch,
            mode="forward+backward",
            device=device,
        )
        for residual in ("standard", "reversible")
        for layers in s.residual_layers
    ]
    crime = crime_and_punishment()
    small_crime = (
        {}
        if s.step_length is None
        else {
            "axial_pos_shape": [64, s.step_length // 64],
            "max_position_embeddings": s.step_length,
        }
    )
    d = [
        model_case(
            label("d", role),
            {**crime, **small_crime, "axial_pos_embds": role == "axial"},
            seq_len=s.axial_length,
            batch=s.axial_batch,
            device=device,
        )
        for role in ("axial", "standard")
    ]
    e = [
        model_case(
            label("e", "train-step"),
            {**crime, **small_crime},
            seq_len=s.step_length or crime["max_position_embeddings"],
            mode="train-step",
            dtype=dtype,
            device=device,
        )
        for dtype in ("float32", "bfloat16")
    ]
    return [
        Experiment(claim="a", cases=tuple(a)),
        Experiment(claim="b", cases=tuple(b)),
        Experiment(claim="c", cases=tuple(c)),
        Experiment(claim="d", cases=tuple(d)),
        Experiment(claim="e", cases=tuple(e), predicted_only=True),
    ]


def parameter_models(size: str) -> dict[str, dict[str, Any]]:
    """Claim d's parameter counts: the crime-and-punishment model with each position table (the
    full config at every size: counting on the meta device allocates nothing)."""
    crime = crime_and_punishment()
    return {
        f"{PREFIX}/{size}/d/{role}-parameters": {**crime, "axial_pos_embds": role == "axial"}
        for role in ("axial", "standard")
    }


def run_reformer(size: str, store: ResultStore, options: RunOptions) -> list[SweepResult]:
    """Measure claims a-e at `size` into `store`, and store claim d's parameter counts. Paper size
    on a CPU is predicted on the meta device (it would not fit or finish here); CPU cases
    predicted above 90% of the available memory are stored as oom with their prediction."""
    if size not in SIZES:
        raise ValueError(f"size {size!r} is not one of: {', '.join(SIZES)}")
    device = options.device
    predicted_only = size == "paper" and device == "cpu"
    meta = {"reproduce": PREFIX, "size": size, "note": SETTINGS[size].note, **options.meta}
    measured, predicted = [], []
    for exp in experiments(size, device=device):
        (predicted if exp.predicted_only or predicted_only else measured).extend(exp.cases)
    sweeps = []
    for cases, metrics, limit in (
        (measured, ("memory", "predict"), default_memory_limit() if device == "cpu" else None),
        (predicted, ("predict",), None),
    ):
        if cases:
            sweeps.append(
                run_sweep(
                    cases,
                    store,
                    settings=MeasureSettings(metrics=metrics, threads=options.threads),
                    policy=options.policy,
                    memory_limit_bytes=limit,
                    progress=options.progress,
                    meta=meta,
                    executor=options.executor,
                )
            )
    if options.policy.dry_run:
        print(f"dry run: would store claim d's {len(parameter_models(size))} parameter counts")
    else:
        store_parameter_counts(size, store, fresh=options.policy.force, meta=meta)
    return sweeps


def count_parameters(model: dict[str, Any]) -> int:
    """Parameters of a ReformerModel (no LM head) with these config fields, built on the meta
    device (nothing allocated)."""
    with torch.device("meta"):
        built = ReformerModel(ReformerConfig.from_dict(model), device="meta")
    return sum(p.numel() for p in built.parameters())


def store_parameter_counts(
    size: str, store: ResultStore, *, fresh: bool = False, meta: dict[str, Any] | None = None
) -> str:
    """Store claim d's parameter counts (one case per position table) in a run of kind
    'reproduce'; returns its id (the latest such run is reused unless `fresh`)."""
    configs = {
        label: {"kind": "parameters", "label": label, "model": model}
        for label, model in parameter_models(size).items()
    }
    fingerprint = hashlib.sha1("\n".join(sorted(configs)).encode()).hexdigest()[:16]
    run_id = None if fresh else store.latest_run(kind=KIND, fingerprint=fingerprint)
    run_id = store.start_run(kind=KIND, run_id=run_id, fingerprint=fingerprint, meta=meta)
    for config in configs.values():
        count = count_parameters(config["model"])
        store.add_rows(run_id, None, config, [metric_row("parameters", count)])
    store.finish_run(run_id)
    return run_id
