"""Recurrences: one state S (key_dim x value_dim per head) updated once per token and read by the
query, S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T, o_t = scale S_t^T q_t. Reference: the
token-by-token recurrence (`reference.py`); implementations: chunked forms (matmuls inside a chunk,
the state carried across chunks) and fla's Triton kernels on CUDA."""
