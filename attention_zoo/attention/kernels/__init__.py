"""Kernels and helpers of the attention backends: math shared by several backends, fused autograd
Functions, and materialised references. Nothing here is registered; each backend module in the
parent package picks its kernel from here."""
