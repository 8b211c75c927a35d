"""Kernelised sums (linear attention, Performer): out_i = phi(q_i) S_i / (phi(q_i) z_i). Reference:
the quadratic form (`reference.py`); implementations: chunked prefix sums with an analytic backward
(`scan.py`), plain sums over the whole sequence, fla's chunked Triton kernels (CUDA)."""
