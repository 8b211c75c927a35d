"""Block variants of the Reformer skeleton: residual variant vs layers, chunked FFN, axial
positions.

One training step (forward + backward + AdamW) of a local/lsh ReformerLM at 1,024 tokens; memory
is the measured peak above resident (profiler on CPU, allocator on CUDA) and the prediction.
Skipped (n/a) until the model and its attention backends are importable/registered.
"""

from __future__ import annotations

from typing import Any

from .common import (
    DEVICES,
    THREADS,
    build,
    case_for,
    measured_peak,
    predicted,
    residual_names,
    run_synced,
    tracks,
    use,
)
from .common import setup as setup  # asv runs a module-level setup before every benchmark

LENGTH = 1024
ATTN_LAYERS = ["local", "lsh"]


def model_case(device: str, mode: str = "train-step", batch: int = 1, **model: Any):
    """A local/lsh ReformerLM case (hidden 256, 4 heads of 64, d_ff 1024) with `model` fields."""
    fields = {
        "hidden_dropout_prob": 0.0,
        "attn_layers": ATTN_LAYERS,
        "feed_forward_size": 1024,
        **model,
    }
    return case_for(
        device=device,
        target="model",
        backend="+".join(ATTN_LAYERS),
        seq_len=LENGTH,
        batch=batch,
        num_heads=4,
        head_dim=64,
        hidden=256,
        mode=mode,
        model=fields,
    )


class _TrainStepBenchmark:
    """Time, measured peak and predicted peak of one training step; subclasses set case/runnable."""

    timeout = 300

    def time_train_step(self, *_: object) -> None:
        run_synced(self.runnable)

    @tracks("peak_bytes")
    def track_peak_bytes(self, *_: object) -> int:
        return measured_peak(self.runnable)

    @tracks("predicted_peak_bytes")
    def track_predicted_peak_bytes(self, *_: object) -> int:
        return predicted(self.case)


class ResidualLayers(_TrainStepBenchmark):
    """Reversible memory barely grows with layers; standard grows by each layer's activations."""

    params = (DEVICES, THREADS, residual_names(), [2, 4, 8])
    param_names = ("device", "threads", "residual", "layers")

    def setup(self, device: str, threads: int, residual: str, layers: int) -> None:
        use(device, threads)
        self.case = model_case(device, residual=residual, num_hidden_layers=layers)
        self.runnable = build(self, self.case)


class ChunkedFFN(_TrainStepBenchmark):
    """Chunking the FFN pays off when the FFN dominates (wide d_ff, few heads)."""

    params = (DEVICES, THREADS, [0, 64, 256])
    param_names = ("device", "threads", "chunk_size_feed_forward")

    def setup(self, device: str, threads: int, chunk: int) -> None:
        use(device, threads)
        self.case = model_case(
            device,
            chunk_size_feed_forward=chunk,
            feed_forward_size=4096,
            num_attention_heads=2,
            attention_head_size=64,
            num_hidden_layers=2,
            residual="standard",
        )
        self.runnable = build(self, self.case)


class AxialPositions:
    """Axial factorised positions vs one table for every position (65,536 positions)."""

    params = (DEVICES, [True, False])
    param_names = ("device", "axial")
    timeout = 300

    def setup(self, device: str, axial: bool) -> None:
        use(device)
        self.case = model_case(
            device,
            axial_pos_embds=axial,
            axial_pos_shape=[256, 256],
            axial_pos_embds_dim=[64, 192],
            max_position_embeddings=65536,
            num_hidden_layers=2,
            residual="reversible",
        )
        self.runnable = build(self, self.case)

    def track_parameters(self, *_: object) -> int:
        return sum(p.numel() for p in self.runnable.module.parameters())

    track_parameters.unit = "parameters"

    @tracks("peak_bytes")
    def track_peak_bytes(self, *_: object) -> int:
        return measured_peak(self.runnable)
