"""Attention backends from the registry: time, memory (measured, tracked, predicted) and FLOPs.

Two targets: the core alone on (q, k, v) and the SelfAttention block around it (hidden 256);
4 heads of 64, batch 1, causal, float32, lengths from common.LENGTHS.
"""

from __future__ import annotations

from .common import (
    LENGTHS,
    MODES,
    backend_names,
    build,
    case_for,
    flops,
    measured_peak,
    predicted,
    run_synced,
    tracked,
    tracks,
)
from .common import setup as setup  # asv runs a module-level setup before every benchmark

TARGETS = ["attention", "block"]


class Time:
    """Wall-clock time of one step (asv repeats and takes statistics)."""

    params = (TARGETS, backend_names(), LENGTHS)
    param_names = ("target", "backend", "seq_len")
    timeout = 300

    def setup(self, target: str, backend: str, seq_len: int) -> None:
        self.forward = build(
            case_for(target=target, backend=backend, seq_len=seq_len, mode="forward")
        )
        self.backward = build(
            case_for(target=target, backend=backend, seq_len=seq_len, mode="forward+backward")
        )

    def time_forward(self, *_: object) -> None:
        run_synced(self.forward)

    def time_forward_backward(self, *_: object) -> None:
        run_synced(self.backward)


class Memory:
    """Peak bytes above resident of one step, measured and cross-checked (deterministic on CPU)."""

    params = (TARGETS, backend_names(), LENGTHS, MODES)
    param_names = ("target", "backend", "seq_len", "mode")
    timeout = 300

    def setup(self, target: str, backend: str, seq_len: int, mode: str) -> None:
        self.runnable = build(case_for(target=target, backend=backend, seq_len=seq_len, mode=mode))

    @tracks("peak_bytes")
    def track_peak_bytes(self, *_: object) -> int:
        """Measured: CUDA allocator peak on GPU, torch.profiler memory events on CPU."""
        return measured_peak(self.runnable)

    @tracks("tracked_peak_bytes")
    def track_tracked_bytes(self, *_: object) -> int:
        """Cross-check: storages counted under a dispatch mode on the real device (no kernel
        scratch)."""
        return tracked(self.runnable)


class Prediction:
    """Predicted peak and FLOPs on FakeTensors: nothing allocated, so long lengths are cheap."""

    params = (TARGETS, backend_names(), [*LENGTHS, 65536], MODES)
    param_names = ("target", "backend", "seq_len", "mode")
    timeout = 300

    def setup(self, target: str, backend: str, seq_len: int, mode: str) -> None:
        self.case = case_for(target=target, backend=backend, seq_len=seq_len, mode=mode)

    @tracks("predicted_peak_bytes")
    def track_predicted_bytes(self, *_: object) -> int:
        return predicted(self.case)

    @tracks("flops")
    def track_flops(self, *_: object) -> int:
        return flops(self.case)
