"""Measurement: time, memory, FLOPs and memory prediction (one module per concern)."""

from .memory import PeakMemory, profiled_peak

__all__ = ["PeakMemory", "profiled_peak"]
