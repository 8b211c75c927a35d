"""The whole ReformerLM (local/lsh layers, reversible, 1,024 tokens) in inference and in training.

Inference is a forward pass in eval mode without autograd; training a forward, backward and AdamW
step with the LM loss.
"""

from __future__ import annotations

from .bench_blocks import model_case
from .common import DEVICES, THREADS, build, measured_peak, run_synced, tracks, use
from .common import setup as setup  # asv runs a module-level setup before every benchmark


class Model:
    """Time and measured peak of one inference or training step of a 2-layer batch-2 model."""

    params = (DEVICES, THREADS, ["forward", "train-step"])
    param_names = ("device", "threads", "mode")
    timeout = 300

    def setup(self, device: str, threads: int, mode: str) -> None:
        use(device, threads)
        self.runnable = build(
            self, model_case(device, mode=mode, batch=2, num_hidden_layers=2, residual="reversible")
        )

    def time_step(self, *_: object) -> None:
        run_synced(self.runnable)

    @tracks("peak_bytes")
    def track_peak_bytes(self, *_: object) -> int:
        return measured_peak(self.runnable)
