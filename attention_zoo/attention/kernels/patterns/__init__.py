"""Fixed patterns (local, sliding window, block-sparse): a softmax under one `mask_mod`, the pattern
written once. Reference: the dense masked softmax (`reference.py`); implementations: PyTorch's fused
CPU kernel over chunk windows or gathered key blocks, materialised blocks, FlexAttention."""
