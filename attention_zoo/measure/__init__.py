"""Measurement: time, memory, FLOPs and their predictions on shapes, one module per concern
(each module's docstring says which); cases.py says what a measured case is."""

from .cases import BenchCase, build_runnable
from .memory import CudaPeak, PeakMemory, RssPeak, cuda_peak, profiled_peak, rss_peak
from .predict import Prediction, predict_case
from .runner import CaseResult, MeasureSettings, Metric, measure_case
from .timing import TimeStats, time_interleaved
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
    "time_interleaved",
    "tracked_peak",
]
