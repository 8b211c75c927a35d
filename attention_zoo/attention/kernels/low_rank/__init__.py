"""Low rank (Nystrom, Linformer): softmax attention over a few landmarks or projected keys. The
plain PyTorch formula is the reference; implementations: the fused CPU kernel over projected keys
(`projected.py`), the plain formula, and the plain formula compiled (CUDA)."""
