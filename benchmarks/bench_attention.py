"""Attention backends from the registry: time, memory (measured, tracked, predicted) and FLOPs.

Two targets: the core alone on (q, k, v) and the SelfAttention block around it (hidden 256);
4 heads of 64, causal, float32 and batch 1 unless a parameter says otherwise. Every setting that
changes a number is a parameter (common.py), so asv records it with the result.
"""

from __future__ import annotations

from .common import (
    DEVICES,
    FULL_LENGTHS,
    LENGTHS,
    MODES,
    PREDICTED_LENGTHS,
    TARGETS,
    THREADS,
    backend_names,
    build,
    build_padded,
    build_timed,
    case_for,
    flops,
    measured_peak,
    padding_options,
    predicted,
    run_synced,
    tracked,
    tracks,
    use,
)
from .common import setup as setup  # asv runs a module-level setup before every benchmark


class Time:
    """Wall-clock time of one step (asv repeats and takes statistics)."""

    params = (DEVICES, THREADS, TARGETS, backend_names(), LENGTHS, MODES)
    param_names = ("device", "threads", "target", "backend", "seq_len", "mode")
    timeout = 300

    def setup(
        self, device: str, threads: int, target: str, backend: str, seq_len: int, mode: str
    ) -> None:
        use(device, threads)
        self.runnable = build_timed(
            self,
            case_for(device=device, target=target, backend=backend, seq_len=seq_len, mode=mode),
        )

    def time_step(self, *_: object) -> None:
        run_synced(self.runnable)


class Memory:
    """Peak bytes above resident of one step, measured and cross-checked (deterministic on CPU)."""

    params = (DEVICES, TARGETS, backend_names(), LENGTHS, MODES)
    param_names = ("device", "target", "backend", "seq_len", "mode")
    timeout = 300

    def setup(self, device: str, target: str, backend: str, seq_len: int, mode: str) -> None:
        use(device)
        self.runnable = build(
            self,
            case_for(device=device, target=target, backend=backend, seq_len=seq_len, mode=mode),
        )

    @tracks("peak_bytes")
    def track_peak_bytes(self, *_: object) -> int:
        """Measured: CUDA allocator peak on GPU, torch.profiler memory events on CPU."""
        return measured_peak(self.runnable)

    @tracks("tracked_peak_bytes")
    def track_tracked_peak_bytes(self, *_: object) -> int:
        """Cross-check: storages counted under a dispatch mode on the real device (no kernel
        scratch)."""
        return tracked(self.runnable)


class Prediction:
    """Predicted peak and FLOPs on shapes only: nothing allocated, so long lengths are cheap."""

    params = (DEVICES, TARGETS, backend_names(), PREDICTED_LENGTHS, MODES)
    param_names = ("device", "target", "backend", "seq_len", "mode")
    timeout = 300

    def setup(self, device: str, target: str, backend: str, seq_len: int, mode: str) -> None:
        use(device)
        self.case = case_for(
            device=device, target=target, backend=backend, seq_len=seq_len, mode=mode
        )

    @tracks("predicted_peak_bytes")
    def track_predicted_peak_bytes(self, *_: object) -> int:
        return predicted(self.case)

    @tracks("flops")
    def track_flops(self, *_: object) -> int:
        return flops(self.case)


SCALING_PEAK_LIMIT = 2**30  # bytes; a case predicted to need more is n/a (quadratic ones at 16k)


class Scaling:
    """Forward time of the core out to long sequences (the full lengths): where the efficient
    backends pull away from full attention. Cases predicted to need over 1 GiB are skipped."""

    params = (DEVICES, THREADS, backend_names(), FULL_LENGTHS)
    param_names = ("device", "threads", "backend", "seq_len")
    timeout = 600

    def setup(self, device: str, threads: int, backend: str, seq_len: int) -> None:
        use(device, threads)
        case = case_for(device=device, backend=backend, seq_len=seq_len)
        if (need := predicted(case)) > SCALING_PEAK_LIMIT:
            raise NotImplementedError(
                f"predicted peak {need / 2**30:.1f} GiB is over Scaling's "
                f"{SCALING_PEAK_LIMIT / 2**30:.0f} GiB limit"
            )
        self.runnable = build(self, case)

    def time_forward(self, *_: object) -> None:
        run_synced(self.runnable)


class LSHHashes:
    """LSH's cost in hash rounds: time and measured peak of the core for 1, 4 and 8 hashes."""

    params = (DEVICES, THREADS, [1, 4, 8], LENGTHS, MODES)
    param_names = ("device", "threads", "num_hashes", "seq_len", "mode")
    timeout = 300

    def setup(self, device: str, threads: int, num_hashes: int, seq_len: int, mode: str) -> None:
        use(device, threads)
        self.runnable = build(
            self,
            case_for(
                device=device,
                backend="lsh",
                seq_len=seq_len,
                mode=mode,
                options={"num_hashes": num_hashes},
            ),
        )

    def time_step(self, *_: object) -> None:
        run_synced(self.runnable)

    @tracks("peak_bytes")
    def track_peak_bytes(self, *_: object) -> int:
        return measured_peak(self.runnable)


class Shapes:
    """Precision and batch: bfloat16 where a backend supports it on the device, batch 4 besides
    batch 1 (the core at 1,024 tokens, forward and forward+backward)."""

    params = (DEVICES, THREADS, backend_names(), ["float32", "bfloat16"], [1, 4], MODES)
    param_names = ("device", "threads", "backend", "dtype", "batch", "mode")
    timeout = 300

    def setup(
        self, device: str, threads: int, backend: str, dtype: str, batch: int, mode: str
    ) -> None:
        use(device, threads)
        self.runnable = build(
            self,
            case_for(
                device=device, backend=backend, seq_len=1024, dtype=dtype, batch=batch, mode=mode
            ),
        )

    def time_step(self, *_: object) -> None:
        run_synced(self.runnable)


class PaddingMask:
    """The core on a batch of 2 whose second row is a quarter padding (key_padding_mask)."""

    params = (DEVICES, THREADS, backend_names(), MODES)
    param_names = ("device", "threads", "backend", "mode")
    timeout = 300

    def setup(self, device: str, threads: int, backend: str, mode: str) -> None:
        use(device, threads)
        options = padding_options(backend, 1024)
        self.runnable = build_padded(
            self,
            case_for(
                device=device, backend=backend, seq_len=1024, batch=2, mode=mode, options=options
            ),
        )

    def time_step(self, *_: object) -> None:
        run_synced(self.runnable)

    @tracks("peak_bytes")
    def track_peak_bytes(self, *_: object) -> int:
        return measured_peak(self.runnable)
