"""Where a training job runs and in which precision: a GPU when there is one, else the CPU.

On a GPU the draft trains and the target writes and reads text in bfloat16 autocast (fp32
weights and optimizer state), as every recent GPU supports it; one without bfloat16 (before
Ampere) runs in float32 rather than fp16, which would need loss scaling. On the CPU bfloat16
autocast is the caller's choice (``bf16``): it halves the memory traffic of a small draft's
matmuls on CPUs with AVX-512 BF16 or AMX, and costs little elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DEVICES = ("auto", "cuda", "cpu")


@dataclass(frozen=True)
class TrainingDevice:
    device: torch.device
    autocast: torch.dtype | None  # None: plain float32
    name: str  # what a log line says

    @property
    def type(self) -> str:
        return self.device.type

    def describe(self) -> str:
        precision = f"{str(self.autocast).removeprefix('torch.')} autocast, fp32 weights" if self.autocast else "float32"
        return f"{self.name} ({self.type}), {precision}"


def choose_device(prefer: str = "auto", *, bf16: bool = True, cuda_available: bool | None = None,
                  cuda_bf16: bool | None = None) -> TrainingDevice:
    """The device of ``prefer`` ("auto": the GPU if torch sees one). ``cuda_available`` and
    ``cuda_bf16`` default to what torch reports; tests pass them to take either branch."""
    if prefer not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {prefer!r}")
    available = torch.cuda.is_available() if cuda_available is None else cuda_available
    if prefer == "cuda" and not available:
        raise ValueError("device cuda: torch sees no GPU (torch.cuda.is_available() is False); pass --device cpu")
    if available and prefer != "cpu":
        supports_bf16 = torch.cuda.is_bf16_supported() if cuda_bf16 is None else cuda_bf16
        name = torch.cuda.get_device_name(0) if cuda_available is None else "GPU"
        return TrainingDevice(torch.device("cuda"), torch.bfloat16 if supports_bf16 else None, name)
    return TrainingDevice(torch.device("cpu"), torch.bfloat16 if bf16 else None, "CPU")
