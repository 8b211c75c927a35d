"""Dense peak FLOP/s of the accelerators we know, per dtype, from their vendors' datasheets: what an
achieved rate is a share of. Dense means without 2:4 structured sparsity (a datasheet's figures
marked "with sparsity" are halved here). A device or dtype not in the table has no peak: no share
is shown for it, never a guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TERA = 1e12

# Which units a dtype's peak counts (fp32 depends on whether cuBLAS may round to TF32).
TENSOR, CUDA_CORES = "tensor cores", "CUDA cores"
TF32 = "tf32"  # the key of the TF32 tensor-core peak: float32 matmuls with allow_tf32 on


@dataclass(frozen=True)
class Peak:
    """A device's dense peak for one dtype."""

    device: str  # the model the device name matched, e.g. "H100 SXM"
    dtype: str  # the case dtype ("bfloat16", ...), or TF32
    units: str  # TENSOR or CUDA_CORES: what runs at this rate
    flops_per_s: float

    def describe(self) -> str:
        """`H100 SXM bfloat16: 989.4 TFLOP/s dense (tensor cores)`."""
        return (
            f"{self.device} {self.dtype}: {self.flops_per_s / TERA:g} TFLOP/s dense ({self.units})"
        )


@dataclass(frozen=True)
class Device:
    """One model: the device names it answers to and its dense TFLOP/s per dtype."""

    model: str
    pattern: str  # a regular expression searched in torch.cuda.get_device_name(), any case
    tflops: dict[str, float]  # dtype (or TF32) -> dense TFLOP/s
    source: str


# fp64 is the FP64 tensor-core peak where there is one: cuBLAS runs FP64 GEMMs on those cores.
# fp32 is the CUDA-core peak (torch's default: no TF32 in matmuls); TF32 is its tensor-core peak.
# Kernels that run fp32 on tensor cores themselves (3xTF32, as cutlass-based attention kernels
# may) can go above the CUDA-core figure.
_HOPPER = {"bfloat16": 989.4, "float16": 989.4, TF32: 494.7, "float32": 66.9, "float64": 66.9}
DEVICES = (
    # torch names the SXM module "NVIDIA H100 80GB HBM3"; the PCIe card "NVIDIA H100 PCIe"; the
    # NVL card (other clocks, not listed) "NVIDIA H100 NVL".
    Device(
        "H100 SXM",
        r"\bH100\b(?=.*\b(?:SXM\d*|HBM3)\b)",
        _HOPPER,
        "NVIDIA H100 datasheet (H100 SXM: 67 FP64 tensor / 34 FP64, 67 FP32, 989 TF32, 1,979 "
        "BF16/FP16 with sparsity) at the Hopper whitepaper's precision (989.4 BF16/FP16 dense, "
        "494.7 TF32, 66.9 FP32, 66.9 FP64 tensor)",
    ),
    Device(
        "H100 PCIe",
        r"\bH100 PCIe\b",
        {"bfloat16": 756.5, "float16": 756.5, TF32: 378.0, "float32": 51.0, "float64": 51.0},
        "NVIDIA H100 datasheet, H100 PCIe: 1,513 BF16/FP16 and 756 TF32 with sparsity (halved), "
        "51 FP32, 51 FP64 tensor",
    ),
    # The H200 is the H100 SXM's GH100 with other memory: the same compute peaks. "NVIDIA H200
    # NVL" (lower power, other clocks) is not matched.
    Device(
        "H200",
        r"\bH200\b(?!\s*NVL)",
        _HOPPER,
        "NVIDIA H200 datasheet (H200 SXM: 67 FP64 tensor, 67 FP32, 989 TF32 and 1,979 BF16/FP16 "
        "with sparsity: the H100 SXM's figures)",
    ),
    # Every A100 form (SXM4 and PCIe, 40 and 80 GB) has the same datasheet peaks.
    Device(
        "A100",
        r"\bA100\b",
        {"bfloat16": 312.0, "float16": 312.0, TF32: 156.0, "float32": 19.5, "float64": 19.5},
        "NVIDIA A100 datasheet: 312 BF16/FP16 and 156 TF32 dense (624 / 312 with sparsity), "
        "19.5 FP32, 19.5 FP64 tensor (9.7 FP64)",
    ),
    Device(
        "L40S",
        r"\bL40S\b",
        {"bfloat16": 362.05, "float16": 362.05, TF32: 183.0, "float32": 91.6},
        "NVIDIA L40S datasheet: 362.05 BF16/FP16 and 183 TF32 dense (733 / 366 with sparsity), "
        "91.6 FP32; no FP64 figure",
    ),
    Device(
        "L4",
        r"\bL4\b",
        {"bfloat16": 121.0, "float16": 121.0, TF32: 60.0, "float32": 30.3},
        "NVIDIA L4 datasheet: 242 BF16/FP16 and 120 TF32 with sparsity (halved), 30.3 FP32; no "
        "FP64 figure",
    ),
)


def known_models() -> list[str]:
    return [d.model for d in DEVICES]


def match_device(device_name: str) -> Device | None:
    """The table's model of a CUDA device name (None: not one we know)."""
    for device in DEVICES:
        if re.search(device.pattern, device_name, flags=re.IGNORECASE):
            return device
    return None


def device_peak(device_name: str, dtype: str, *, tf32: bool | None) -> Peak | None:
    """The dense peak of `device_name` for `dtype`, None where it is not known. A float32 case
    needs `tf32` (whether torch let cuBLAS use TF32): None, not recorded, gives no peak."""
    device = match_device(device_name)
    if device is None:
        return None
    key, units = dtype, TENSOR
    if dtype == "float32":
        if tf32 is None:
            return None
        key, units = (TF32, TENSOR) if tf32 else ("float32", CUDA_CORES)
    if key not in device.tflops:
        return None
    return Peak(device.model, key, units, device.tflops[key] * TERA)
