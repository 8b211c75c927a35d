"""Sorted rounds (LSH; HF-semantics local as one round): positions sorted by bucket per round, chunk
windows over the sorted order, rounds merged by log-sum-exp. Reference: dense per-round masks
(`reference.py`); implementations: the fused CPU kernel, materialised blocks, FlexAttention."""
