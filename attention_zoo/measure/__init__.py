"""Measurement: time, memory, FLOPs and memory prediction (one module per concern).

timing.py   warm-up, repeats until a budget, median/IQR/min; CUDA events; threads recorded
memory.py   measured peaks: torch.profiler on CPU, allocator stats on CUDA; RSS as a cross-check
tracker.py  live storage bytes under a dispatch mode (cross-check on real devices; predictor
            on fake ones)
predict.py  memory and FLOPs of a case on shapes only: any length, any device, nothing allocated
flops.py    FLOPs from PyTorch's flop formulas (plus the CPU flash-attention kernels)
throughput.py  FLOP rate achieved and its share of the device's dense peak (peaks.py): derived
            where rows are read
cases.py    BenchCase (what is measured) and building it into a runnable step
runner.py   measure_case: one case -> status + metric rows; measure_group: compared cases timed
            round-robin; worker.py: one case in a subprocess
peers.py    other libraries' Reformer attention (transformers, reformer-pytorch) as bench targets
env.py      git commit, torch version, device name, threads
labels.py   how a measured variant is named (one spelling for tables and reports), the default
            reference of ratios; table.py: the plain-text tables
"""

from .cases import BenchCase, build_runnable
from .memory import CudaPeak, PeakMemory, RssPeak, cuda_peak, profiled_peak, rss_peak
from .predict import Prediction, predict_case
from .runner import CaseResult, MeasureSettings, Metric, measure_case
from .timing import TimeStats, time_call, time_interleaved
from .tracker import StorageTracker, tracked_peak

__all__ = [
    "BenchCase",
    "CaseResult",
    "CudaPeak",
    "MeasureSettings",
    "Metric",
    "PeakMemory",
    "Prediction",
    "RssPeak",
    "StorageTracker",
    "TimeStats",
    "build_runnable",
    "cuda_peak",
    "measure_case",
    "predict_case",
    "profiled_peak",
    "rss_peak",
    "time_call",
    "time_interleaved",
    "tracked_peak",
]
