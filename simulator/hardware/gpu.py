"""GPU model: per-operator roofline with tile/wave quantization and fixed per-kernel costs."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from .ops import Op

TILE = 128
SPLIT_K_MIN = 256


@dataclass(frozen=True)
class GPU:
    """Timing model of one GPU, in SI units.

    An operator takes max(FLOPs / achievable FLOP/s, bytes / achievable HBM bandwidth) plus a
    fixed per-kernel cost. A GEMM's achievable FLOP/s is further scaled by how well its
    128x128 output tiles fill the SMs (wave quantization, with split-K when there are fewer
    tiles than SMs), and with only w waves of tiles in flight, memory traffic hides behind
    compute only partially: min(compute, memory)/w is added. One wave serializes the two.
    """

    name: str
    peak_flops: dict
    memory: float
    hbm_bandwidth: float
    sm_count: int
    matmul_eff: float
    matmul_fp8_eff: float
    hbm_eff: float
    kernel_overhead: float
    launch_overhead: float

    @classmethod
    def from_spec(cls, spec) -> "GPU":
        """Build from a validated :class:`simulator.config.models.GPUSpec`."""
        return cls(spec.name, dict(spec.peak_flops), spec.memory, spec.hbm_bandwidth, spec.sm_count,
                   spec.achievable.matmul, spec.achievable.matmul_fp8, spec.achievable.hbm,
                   spec.kernel_overhead, spec.launch_overhead)

    @property
    def bandwidth(self) -> float:
        """Achievable HBM bandwidth, bytes/s."""
        return self.hbm_bandwidth * self.hbm_eff

    def flops_rate(self, dtype: str) -> float:
        """Achievable FLOP/s of a large matrix multiply in ``dtype``."""
        peak = self.peak_flops.get(dtype) or self.peak_flops["bf16"]
        return peak * (self.matmul_fp8_eff if dtype == "fp8" else self.matmul_eff)

    def wave_efficiency(self, m: int, n: int, k: int) -> tuple[float, int]:
        """(fraction of SM slots doing useful tiles, number of waves) for an m x n x k GEMM."""
        tiles = math.ceil(m / TILE) * math.ceil(n / TILE)
        split = 1
        if tiles < self.sm_count:
            split = max(1, min(self.sm_count // tiles, math.ceil(k / SPLIT_K_MIN)))
        units = tiles * split
        waves = math.ceil(units / self.sm_count)
        return units / (waves * self.sm_count), waves

    def op_time(self, op: Op) -> float:
        """GPU time of ``op`` (all its ``count`` repetitions), seconds."""
        mem = op.bytes / self.bandwidth
        rate = self.flops_rate(op.dtype)
        if op.gemm is not None:
            eff, waves = self.wave_efficiency(*op.gemm)
            comp = op.flops / (rate * eff)
            t = max(comp, mem) + min(comp, mem) / waves
        else:
            t = max(op.flops / rate, mem)
        return op.count * (t + self.kernel_overhead)

    def ops_time(self, ops: Iterable[Op]) -> float:
        """Total GPU time of a sequence of operators run back to back."""
        return sum(self.op_time(op) for op in ops)

    def launch_time(self, kernels: int, cuda_graphs: bool) -> float:
        """CPU time to launch ``kernels`` kernels: one graph replay, or one launch each."""
        return self.launch_overhead if cuda_graphs else kernels * self.launch_overhead
