"""PyTorch's fused CPU attention, named once: the flash forward (output and log-sum-exp, an
additive mask allowed) and its backward, called by the CPU kernels a segment at a time."""

from __future__ import annotations

import torch

flash_forward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
