"""The unit of work handed to a GPU model: one operator's FLOPs and HBM bytes."""

from __future__ import annotations

from dataclasses import dataclass

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
"""Bytes per element of each dtype an operator can run in."""


@dataclass(frozen=True)
class Op:
    """One kernel: ``flops`` of arithmetic, ``bytes`` of HBM traffic, repeated ``count`` times.

    ``gemm`` carries the (m, n, k) shape of a matrix multiply so the GPU model can account
    for tile and wave quantization; ``None`` for everything else (attention, norms, elementwise).
    ``dtype`` picks the peak: ``"bf16"``, ``"fp16"``, ``"fp8"`` or ``"fp32"``. ``bandwidth_share``: the
    share of the GPU's achievable HBM bandwidth the kernel reaches (below 1 for a kernel measured to fall
    short of it, such as an unvectorised broadcast add).
    """

    name: str
    flops: float
    bytes: float
    gemm: tuple[int, int, int] | None = None
    count: int = 1
    dtype: str = "bf16"
    bandwidth_share: float = 1.0
